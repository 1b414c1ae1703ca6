#include "model/safetensors_file.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/model/gguf_test_writer.h"
#include "tests/model/safetensors_test_writer.h"

namespace strata {
namespace {

using test::SafetensorsTestWriter;
using test::TempFile;

SafetensorsTestWriter small_writer() {
  SafetensorsTestWriter w;
  w.add_f32("a", {2, 3}, {1, 2, 3, 4, 5, 6});
  w.add("b", "BF16", {2}, {0x80, 0x3F, 0x40, 0xC0});  // 1.0, -3.0
  w.add("c", "F16", {1}, {0x00, 0x3C});
  w.add("ids", "I64", {1}, std::vector<uint8_t>(8, 0));
  w.header()["__metadata__"] = {{"format", "pt"}};
  return w;
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  TempFile f(bytes, ".safetensors");
  try {
    SafetensorsFile::open(f.path());
    ADD_FAILURE() << "expected SafetensorsError containing '" << fragment << "'";
  } catch (const SafetensorsError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(f.path()), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
  }
}

TEST(SafetensorsFile, ParsesHeaderAndData) {
  TempFile f(small_writer().bytes(), ".safetensors");
  auto s = SafetensorsFile::open(f.path());
  ASSERT_EQ(s->tensors().size(), 4u);
  EXPECT_EQ(s->data_offset() % 8, 0u);
  const SafetensorsTensor* a = s->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->n_elements(), 6);
  EXPECT_EQ(a->n_bytes, 24u);
  EXPECT_EQ(a->offset, s->data_offset());
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[5], 6.0f);
  EXPECT_EQ(a->ggml_type(), GgmlType::f32);
  const SafetensorsTensor* b = s->find("b");
  EXPECT_EQ(b->ggml_type(), GgmlType::bf16);
  float values[2];
  dequantize_row(*b->ggml_type(), b->data, values, 2);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], -3.0f);
  EXPECT_EQ(s->find("c")->ggml_type(), GgmlType::f16);
  EXPECT_EQ(s->find("ids")->ggml_type(), std::nullopt);
  EXPECT_EQ(s->find("ids")->element_bytes, 8);
  EXPECT_EQ(s->find("missing"), nullptr);
  EXPECT_EQ(s->metadata().at("format"), "pt");
}

TEST(SafetensorsFile, TruncatedFiles) {
  const std::vector<uint8_t> bytes = small_writer().bytes();
  expect_error({}, "expected a u64 header length at offset 0");
  expect_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 20), "JSON header at offset 8");
  // Cut inside the data: the last tensor's offsets no longer fit.
  expect_error(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1), "do not fit in the data section");
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    TempFile f(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(cut)), ".safetensors");
    EXPECT_THROW(SafetensorsFile::open(f.path()), SafetensorsError) << "cut at " << cut;
  }
}

TEST(SafetensorsFile, HugeHeaderLength) {
  std::vector<uint8_t> bytes = small_writer().bytes();
  const uint64_t huge = 1ull << 40;
  std::memcpy(bytes.data(), &huge, 8);
  expect_error(bytes, "exceeds the limit");
}

TEST(SafetensorsFile, InvalidHeaders) {
  SafetensorsTestWriter w = small_writer();
  expect_error(w.bytes_with_header("{not json"), "invalid JSON header");
  expect_error(w.bytes_with_header("[1, 2]"), "not an object");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                       "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})"),
               "duplicate tensor name 'a'");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}})"),
               "unknown dtype 'Q7'");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})"),
               "shape and dtype need");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})"),
               "non-negative");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})"),
               "do not fit");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [2]}})"), "data_offsets");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})"),
               "overlap");
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [2, 4611686018427387904, 4],
                                             "data_offsets": [0, 8]}})"),
               "overflows");
}

// Found by tests/fuzz/safetensors_fuzz.cpp: an empty tensor between two overlapping ones hid their overlap.
TEST(SafetensorsFile, OverlapBehindAnEmptyTensorIsFound) {
  SafetensorsTestWriter w = small_writer();
  expect_error(w.bytes_with_header(R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
                                       "b": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
                                       "c": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})"),
               "tensors 'a' and 'c' overlap");
}

}  // namespace
}  // namespace strata
