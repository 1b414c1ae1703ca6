#include "model/gguf_file.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/model/gguf_test_writer.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using test::GgufTestWriter;
using test::TempFile;

// A file with one key of every value type, arrays, and two tensors.
GgufTestWriter full_writer() {
  GgufTestWriter w;
  w.add("t.u8", GgufValueType::u8, uint8_t{200});
  w.add("t.i8", GgufValueType::i8, int8_t{-100});
  w.add("t.u16", GgufValueType::u16, uint16_t{60000});
  w.add("t.i16", GgufValueType::i16, int16_t{-30000});
  w.add("t.u32", GgufValueType::u32, uint32_t{4000000000u});
  w.add("t.i32", GgufValueType::i32, int32_t{-2000000000});
  w.add("t.f32", GgufValueType::f32, 1.5f);
  w.add("t.bool", GgufValueType::boolean, uint8_t{1});
  w.add_string("t.string", "héllo");
  w.add("t.u64", GgufValueType::u64, uint64_t{18000000000000000000ull});
  w.add("t.i64", GgufValueType::i64, int64_t{-9000000000000000000ll});
  w.add("t.f64", GgufValueType::f64, 2.25);
  w.add_array("t.arr_i32", GgufValueType::i32, std::vector<int32_t>{1, -2, 3});
  w.add_array("t.arr_u8", GgufValueType::u8, std::vector<uint8_t>{7, 8});
  w.add_array("t.arr_bool", GgufValueType::boolean, std::vector<uint8_t>{0, 1, 1});
  w.add_array("t.arr_f32", GgufValueType::f32, std::vector<float>{0.5f, -1.0f});
  w.add_array("t.arr_f64", GgufValueType::f64, std::vector<double>{3.0});
  w.add_array("t.arr_empty", GgufValueType::u32, std::vector<uint32_t>{});
  w.add_string_array("t.arr_str", {"a", "", "c d"});
  w.add_f32_tensor("vec", {3}, {1.0f, 2.0f, 3.0f});
  std::vector<uint8_t> q8(34 * 2, 0);
  q8[1] = 0x3C;  // d = 1 in the first block
  q8[2] = 5;
  w.add_tensor("mat", {32, 2}, static_cast<uint32_t>(GgmlType::q8_0), q8);
  return w;
}

// Expects GgufError with every fragment in its message.
void expect_gguf_error(const std::vector<uint8_t>& bytes, std::vector<std::string> fragments) {
  TempFile f(bytes);
  try {
    GgufFile::open(f.path());
    ADD_FAILURE() << "expected GgufError containing '" << fragments.front() << "'";
  } catch (const GgufError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(f.path()), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
    }
  }
}

TEST(GgufFile, ParsesEveryValueType) {
  TempFile f(full_writer().bytes());
  auto g = GgufFile::open(f.path());
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->alignment(), 32u);
  EXPECT_EQ(g->data_offset() % 32, 0u);
  EXPECT_EQ(g->get_int("t.u8"), 200);
  EXPECT_EQ(g->get_int("t.i8"), -100);
  EXPECT_EQ(g->get_int("t.u16"), 60000);
  EXPECT_EQ(g->get_int("t.i16"), -30000);
  EXPECT_EQ(g->get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(g->get_int("t.i32"), -2000000000);
  EXPECT_EQ(g->get_float("t.f32"), 1.5);
  EXPECT_EQ(g->get_bool("t.bool"), true);
  EXPECT_EQ(g->get_string("t.string"), "héllo");
  EXPECT_EQ(g->find("t.u64")->uint_value, 18000000000000000000ull);
  EXPECT_THROW(g->get_int("t.u64"), GgufError);  // does not fit in i64
  EXPECT_EQ(g->get_float("t.u64"), 18000000000000000000.0);
  EXPECT_EQ(g->get_int("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(g->get_float("t.f64"), 2.25);
  EXPECT_EQ(g->get_float("t.u32"), 4000000000.0);  // integers widen to float
  EXPECT_EQ(g->get_int_array("t.arr_i32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(g->get_int_array("t.arr_u8"), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(g->get_int_array("t.arr_bool"), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(g->get_float_array("t.arr_f32"), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(g->get_float_array("t.arr_f64"), (std::vector<double>{3.0}));
  EXPECT_EQ(g->get_float_array("t.arr_i32"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(g->get_int_array("t.arr_empty"), (std::vector<int64_t>{}));
  EXPECT_EQ(g->get_string_array("t.arr_str"), (std::vector<std::string>{"a", "", "c d"}));
  EXPECT_EQ(g->find("t.arr_str")->array_count, 3u);
  EXPECT_EQ(g->find("t.arr_str")->element_type, GgufValueType::string);
  EXPECT_EQ(g->get_int("absent"), std::nullopt);
  EXPECT_EQ(g->get_string_array("absent"), std::nullopt);

  ASSERT_EQ(g->tensors().size(), 2u);
  const GgufTensorInfo& vec = g->tensor("vec");
  EXPECT_EQ(vec.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(vec.type, GgmlType::f32);
  EXPECT_EQ(vec.n_bytes, 12u);
  EXPECT_EQ(vec.offset, g->data_offset());
  EXPECT_EQ(reinterpret_cast<const float*>(vec.data)[2], 3.0f);
  const GgufTensorInfo& mat = g->tensor("mat");
  EXPECT_EQ(mat.type, GgmlType::q8_0);
  EXPECT_EQ(mat.n_elements(), 64);
  EXPECT_EQ(mat.n_rows(), 2);
  EXPECT_EQ(mat.row_length(), 32);
  EXPECT_EQ(mat.n_bytes, 68u);
  EXPECT_EQ(mat.offset, g->data_offset() + 32);  // the previous tensor is padded to the alignment
  EXPECT_EQ(mat.data[2], 5);
  EXPECT_EQ(g->find_tensor("nope"), nullptr);
  EXPECT_THROW(g->tensor("nope"), GgufError);
}

TEST(GgufFile, WrongTypeNamesTheKey) {
  TempFile f(full_writer().bytes());
  auto g = GgufFile::open(f.path());
  for (auto call : {+[](const GgufFile& g) { g.get_string("t.u32"); },
                    +[](const GgufFile& g) { g.get_int("t.string"); },
                    +[](const GgufFile& g) { g.get_string_array("t.arr_i32"); },
                    +[](const GgufFile& g) { g.get_int_array("t.arr_str"); },
                    +[](const GgufFile& g) { g.get_float("t.string"); }}) {
    try {
      call(*g);
      ADD_FAILURE() << "expected GgufError";
    } catch (const GgufError& e) {
      EXPECT_NE(std::string(e.what()).find("'t."), std::string::npos) << e.what();
    }
  }
}

TEST(GgufFile, AlignmentKeyMovesTheDataSection) {
  GgufTestWriter w = full_writer();
  w.alignment = 256;
  w.add("general.alignment", GgufValueType::u32, uint32_t{256});
  TempFile f(w.bytes());
  auto g = GgufFile::open(f.path());
  EXPECT_EQ(g->alignment(), 256u);
  EXPECT_EQ(g->data_offset() % 256, 0u);
  EXPECT_EQ(g->tensor("mat").offset, g->data_offset() + 256);
  EXPECT_EQ(g->tensor("mat").data[2], 5);
  EXPECT_EQ(reinterpret_cast<const float*>(g->tensor("vec").data)[0], 1.0f);
}

TEST(GgufFile, Version2IsAccepted) {
  GgufTestWriter w = full_writer();
  w.version = 2;
  TempFile f(w.bytes());
  EXPECT_EQ(GgufFile::open(f.path())->version(), 2u);
}

TEST(GgufFile, TruncatedAtEveryByteRaisesAnOffsetError) {
  const std::vector<uint8_t> bytes = full_writer().bytes();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    TempFile f(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(cut)));
    try {
      GgufFile::open(f.path());
      ADD_FAILURE() << "a file cut at byte " << cut << " of " << bytes.size() << " was accepted";
    } catch (const GgufError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("offset"), std::string::npos) << "cut " << cut << ": " << message;
      EXPECT_NE(message.find("file ends at " + std::to_string(cut)), std::string::npos) << "cut " << cut << ": "
                                                                                       << message;
    }
  }
}

TEST(GgufFile, TruncationMessageNamesWhatWasExpected) {
  const std::vector<uint8_t> bytes = full_writer().bytes();
  // Cut inside the length of the first key: offset 24 is where it starts.
  expect_gguf_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 27),
                    {"offset 24: expected a u64 length of a metadata key, file ends at 27"});
}

TEST(GgufFile, RandomCorruptionNeverCrashes) {
  const std::vector<uint8_t> bytes = full_writer().bytes();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 1500; ++trial) {
    std::vector<uint8_t> corrupt = bytes;
    const int n_flips = 1 + trial % 4;
    for (int i = 0; i < n_flips; ++i) {
      const size_t at = rng() % std::min<size_t>(corrupt.size(), 600);
      corrupt[at] = trial % 3 == 0 ? 0xFF : static_cast<uint8_t>(rng());
    }
    TempFile f(corrupt);
    try {
      auto g = GgufFile::open(f.path());
      for (const GgufTensorInfo& t : g->tensors()) {
        ASSERT_LE(t.offset + t.n_bytes, corrupt.size());
      }
    } catch (const GgufError& e) {
      EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
    }
  }
}

TEST(GgufFile, BadMagic) {
  GgufTestWriter w = full_writer();
  w.magic[0] = 'X';
  expect_gguf_error(w.bytes(), {"offset 0", "magic"});
}

TEST(GgufFile, Version1IsRejected) {
  GgufTestWriter w = full_writer();
  w.version = 1;
  expect_gguf_error(w.bytes(), {"offset 4", "version 1"});
}

TEST(GgufFile, UnknownVersionIsRejected) {
  GgufTestWriter w = full_writer();
  w.version = 4;
  expect_gguf_error(w.bytes(), {"offset 4", "version 4"});
}

TEST(GgufFile, BigEndianIsDetected) {
  GgufTestWriter w = full_writer();
  w.version = 0x03000000;
  expect_gguf_error(w.bytes(), {"offset 4", "big-endian"});
}

TEST(GgufFile, AlignmentMustBeAPowerOfTwo) {
  GgufTestWriter w;
  w.add("general.alignment", GgufValueType::u32, uint32_t{48});
  expect_gguf_error(w.bytes(), {"offset", "power of two", "48"});
  GgufTestWriter zero;
  zero.add("general.alignment", GgufValueType::u32, uint32_t{0});
  expect_gguf_error(zero.bytes(), {"power of two"});
}

TEST(GgufFile, AlignmentMustBeU32) {
  GgufTestWriter w;
  w.add("general.alignment", GgufValueType::u64, uint64_t{64});
  expect_gguf_error(w.bytes(), {"general.alignment must be a u32", "u64"});
}

TEST(GgufFile, TensorPastTheEndOfTheFile) {
  GgufTestWriter w;
  w.add_f32_tensor("big", {8}, {1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<uint8_t> bytes = w.bytes();
  bytes.erase(bytes.end() - 4, bytes.end());
  expect_gguf_error(bytes, {"offset", "'big'", "32 bytes", "file ends at " + std::to_string(bytes.size())});
}

TEST(GgufFile, NestedArrayIsRejected) {
  GgufTestWriter w;
  std::vector<uint8_t> raw;
  auto put = [&](auto v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    raw.insert(raw.end(), p, p + sizeof v);
  };
  put(uint64_t{6});
  raw.insert(raw.end(), {'n', 'e', 's', 't', 'e', 'd'});
  put(uint32_t{9});  // array
  put(uint32_t{9});  // of arrays
  put(uint64_t{1});
  w.add_raw_kv(raw);
  expect_gguf_error(w.bytes(), {"offset 42", "nested arrays", "'nested'"});
}

TEST(GgufFile, UnknownValueType) {
  GgufTestWriter w;
  w.add("weird", static_cast<GgufValueType>(13), uint32_t{0});
  expect_gguf_error(w.bytes(), {"offset 37", "unknown metadata value type 13", "'weird'"});
}

TEST(GgufFile, UnknownTensorType) {
  GgufTestWriter w;
  w.add_tensor("t", {4}, 77, std::vector<uint8_t>(16));
  expect_gguf_error(w.bytes(), {"offset", "unknown ggml type id 77", "'t'"});
}

TEST(GgufFile, RowLengthMustBeAWholeNumberOfBlocks) {
  GgufTestWriter w;
  w.add_tensor("t", {48, 1}, static_cast<uint32_t>(GgmlType::q4_0), std::vector<uint8_t>(36));
  expect_gguf_error(w.bytes(), {"offset", "48", "block size 32"});
}

TEST(GgufFile, TooManyDimensions) {
  GgufTestWriter w;
  w.add_tensor("t", {1, 1, 1, 1, 1}, 0, std::vector<uint8_t>(4));
  expect_gguf_error(w.bytes(), {"offset", "5 dimensions"});
}

TEST(GgufFile, DuplicateKey) {
  GgufTestWriter w;
  w.add("k", GgufValueType::u8, uint8_t{1});
  w.add("k", GgufValueType::u8, uint8_t{2});
  expect_gguf_error(w.bytes(), {"offset", "duplicate metadata key 'k'"});
}

TEST(GgufFile, DuplicateTensorName) {
  GgufTestWriter w;
  w.add_f32_tensor("t", {1}, {1.0f});
  w.add_f32_tensor("t", {1}, {2.0f});
  expect_gguf_error(w.bytes(), {"offset", "duplicate tensor name 't'"});
}

TEST(GgufFile, HugeCountsFailWithoutHugeAllocations) {
  GgufTestWriter w;
  w.add_array("a", GgufValueType::u64, std::vector<uint64_t>{1});
  std::vector<uint8_t> bytes = w.bytes();
  // The array's element count sits after magic, version, counts (24), key (8 + 1) and two u32 types.
  const size_t count_at = 24 + 9 + 4 + 4;
  const uint64_t huge = 1ull << 61;
  std::memcpy(bytes.data() + count_at, &huge, 8);
  expect_gguf_error(bytes, {"offset " + std::to_string(count_at), "cannot fit"});

  GgufTestWriter s;
  s.add_string("s", "abc");
  bytes = s.bytes();
  std::memcpy(bytes.data() + 24 + 9 + 4, &huge, 8);  // the string's length
  expect_gguf_error(bytes, {"offset " + std::to_string(24 + 9 + 4 + 8), "bytes of a string value"});

  GgufTestWriter t;
  bytes = t.bytes();
  std::memcpy(bytes.data() + 8, &huge, 8);  // tensor count
  // The padding after the header reads as an empty name; the dimension count is missing.
  expect_gguf_error(bytes, {"offset 32", "expected a u32 dimension count, file ends at 32"});
}

TEST(GgufFile, EmptyAndMissingFiles) {
  expect_gguf_error({}, {"offset 0", "file ends at 0"});
  EXPECT_THROW(GgufFile::open("/nonexistent/model.gguf"), std::system_error);
  try {
    GgufFile::open("/nonexistent/model.gguf");
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

TEST(GgufFile, RealModel) {
  auto g = GgufFile::open(test::smollm2_gguf_path());
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->tensors().size(), 272u);
  EXPECT_EQ(g->data_offset() % g->alignment(), 0u);
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->get_int("llama.block_count"), 30);
  EXPECT_EQ(g->get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  int q4_1 = 0, q8_0 = 0, f32 = 0;
  for (const GgufTensorInfo& t : g->tensors()) {
    q4_1 += t.type == GgmlType::q4_1;
    q8_0 += t.type == GgmlType::q8_0;
    f32 += t.type == GgmlType::f32;
  }
  EXPECT_EQ(q4_1, 210);
  EXPECT_EQ(q8_0, 1);
  EXPECT_EQ(f32, 61);
  const GgufTensorInfo& embd = g->tensor("token_embd.weight");
  EXPECT_EQ(embd.type, GgmlType::q8_0);
  EXPECT_EQ(embd.shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd.n_bytes, 612u * 49152);
  EXPECT_EQ(g->tensor("blk.0.ffn_down.weight").shape, (std::vector<int64_t>{1536, 576}));
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);
}

}  // namespace
}  // namespace strata
