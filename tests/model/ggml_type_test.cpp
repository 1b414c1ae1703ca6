#include "model/ggml_type.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_paths.h"

namespace strata {
namespace {

std::vector<float> dequantize(GgmlType type, const std::vector<uint8_t>& blocks, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(type, blocks.data(), out.data(), n);
  return out;
}

void put_f16(std::vector<uint8_t>& b, size_t at, uint16_t bits) {
  b[at] = static_cast<uint8_t>(bits & 0xFF);
  b[at + 1] = static_cast<uint8_t>(bits >> 8);
}

TEST(GgmlType, TraitsCoverTheSpecTable) {
  const GgmlTypeTraits* q4_1 = ggml_type_traits(3);
  ASSERT_NE(q4_1, nullptr);
  EXPECT_EQ(q4_1->name, "q4_1");
  EXPECT_EQ(q4_1->block_elements, 32);
  EXPECT_EQ(q4_1->block_bytes, 20);
  EXPECT_TRUE(q4_1->supported);
  EXPECT_EQ(ggml_type_traits(14)->block_bytes, 210);
  EXPECT_EQ(ggml_type_traits(12)->block_bytes, 144);
  EXPECT_EQ(ggml_type_traits(30)->name, "bf16");
  // Known but not dequantizable: listed so that errors can name them.
  ASSERT_NE(ggml_type_traits(10), nullptr);
  EXPECT_EQ(ggml_type_traits(10)->name, "q2_k");
  EXPECT_FALSE(ggml_type_traits(10)->supported);
  EXPECT_EQ(ggml_type_traits(39)->name, "mxfp4");
  // Removed or unknown ids.
  EXPECT_EQ(ggml_type_traits(4), nullptr);
  EXPECT_EQ(ggml_type_traits(31), nullptr);
  EXPECT_EQ(ggml_type_traits(1000), nullptr);
  EXPECT_EQ(ggml_type_name(GgmlType::q8_0), "q8_0");
}

TEST(GgmlType, RowBytes) {
  EXPECT_EQ(ggml_row_bytes(GgmlType::q4_1, 576), 360u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::q4_1, 1536), 960u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::q8_0, 576), 612u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::f32, 3), 12u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::q6_k, 512), 420u);
  EXPECT_THROW(ggml_row_bytes(GgmlType::q4_0, 33), std::invalid_argument);
}

TEST(GgmlType, UnsupportedTypesThrowNamingTheType) {
  std::vector<uint8_t> block(84);
  float out[256];
  try {
    dequantize_row(GgmlType::q2_k, block.data(), out, 256);
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(static_cast<GgmlType>(5), block.data(), out, 32), std::invalid_argument);
}

TEST(GgmlType, F16HandComputed) {
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));        // smallest normal
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));        // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x03FF), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_fp32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_fp32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0xFC01)));
  EXPECT_EQ(fp16_to_fp32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(fp16_to_fp32(0x8000)));
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);

  std::vector<uint8_t> raw = {0x00, 0x3C, 0x01, 0x00, 0x00, 0xFC};
  EXPECT_EQ(dequantize(GgmlType::f16, raw, 3), (std::vector<float>{1.0f, std::ldexp(1.0f, -24),
                                                                  -std::numeric_limits<float>::infinity()}));
}

// Every one of the 65,536 halves against binary16's definition evaluated in double precision: (-1)^s 2^(e-15)
// (1 + m/1024) for normal numbers, (-1)^s 2^-14 (m/1024) for subnormals; inf and NaN (with its payload) at e = 31.
TEST(GgmlType, F16EveryBitPatternMatchesTheDefinition) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const float got = fp16_to_fp32(uint16_t(h));
    ASSERT_EQ(std::signbit(got), sign == 1) << std::hex << h;
    if (e == 31) {
      ASSERT_EQ(std::isnan(got), m != 0) << std::hex << h;
      if (m == 0) ASSERT_TRUE(std::isinf(got)) << std::hex << h;
      else ASSERT_EQ((std::bit_cast<uint32_t>(got) >> 13) & 0x3FF, uint32_t(m)) << std::hex << h;  // payload
      continue;
    }
    const double magnitude = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15);
    ASSERT_EQ(double(got), sign ? -magnitude : magnitude) << std::hex << h;
  }
}

// A row of halves widened as the KV pools and the F16 weights are (dequantize_weight_row: F16C where the CPU has
// it, 8 at a time, else the portable loop): every pattern, and a tail shorter than 8, as fp16_to_fp32 gives it, but
// that a signaling NaN may come back quiet (its payload's other bits kept).
TEST(GgmlType, F16RowsWidenAsEachHalf) {
  std::vector<uint8_t> row;
  for (uint32_t h = 0; h <= 0xFFFF + 5; ++h) {
    row.push_back(uint8_t(h & 0xFF));
    row.push_back(uint8_t((h >> 8) & 0xFF));
  }
  const int64_t n = int64_t(row.size() / 2);
  std::vector<float> got(static_cast<size_t>(n));
  dequantize_weight_row(WeightFormat::f16, row.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = uint16_t(i & 0xFFFF);
    const uint32_t want = std::bit_cast<uint32_t>(fp16_to_fp32(h)), bits = std::bit_cast<uint32_t>(got[size_t(i)]);
    if (std::isnan(fp16_to_fp32(h))) {
      ASSERT_TRUE(std::isnan(got[size_t(i)])) << std::hex << h;
      ASSERT_EQ(bits | 0x00400000u, want | 0x00400000u) << std::hex << h;
    } else {
      ASSERT_EQ(bits, want) << std::hex << h;
    }
  }
}

TEST(GgmlType, Bf16HandComputed) {
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xC040), -3.0f);
  EXPECT_EQ(bf16_to_fp32(0x7F80), std::numeric_limits<float>::infinity());
  std::vector<uint8_t> raw = {0x80, 0x3F, 0x40, 0xC0, 0x49, 0x40};
  EXPECT_EQ(dequantize(GgmlType::bf16, raw, 3), (std::vector<float>{1.0f, -3.0f, 3.140625f}));
}

// fp32 to f16 and bf16 (model.weight_dtype f16 and bf16, the Q8_0 scales): to nearest, ties to even; too large
// for the format is inf; NaN stays NaN (quiet).
TEST(GgmlType, Fp32ToHalfRoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);      // halfway: to the even 1.0
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // halfway: to the even 1 + 2^-9
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);             // the largest half
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);             // halfway to 65536: inf
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);             // the smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);             // halfway to it: to the even 0
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7E00, 0x7E00);
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(-3.0f), 0xC040);
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3F80);       // halfway: to the even 1.0
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);   // halfway: to the even 1 + 2^-6
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16: inf
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // a NaN whose payload bf16 drops: still NaN
  // Every finite 16-bit value comes back as itself.
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    if ((h & 0x7C00) != 0x7C00) {
      ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(uint16_t(h))), h) << std::hex << h;
    }
    if ((h & 0x7F80) != 0x7F80) {
      ASSERT_EQ(fp32_to_bf16(bf16_to_fp32(uint16_t(h))), h) << std::hex << h;
    }
  }
}

TEST(GgmlType, Q4_0HandComputed) {
  std::vector<uint8_t> b(18, 0x88);  // every nibble 8 -> 0
  put_f16(b, 0, 0x3800);             // d = 0.5
  b[2 + 0] = 0x1F;                   // low nibble 15 -> y[0]; high nibble 1 -> y[16]
  b[2 + 15] = 0x08;                  // y[15] = 0, y[31] = (0 - 8) * 0.5
  std::vector<float> y = dequantize(GgmlType::q4_0, b, 32);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[16], -3.5f);
  EXPECT_EQ(y[15], 0.0f);
  EXPECT_EQ(y[31], -4.0f);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(GgmlType, Q4_1HandComputed) {
  std::vector<uint8_t> b(20, 0x00);
  put_f16(b, 0, 0x3400);  // d = 0.25
  put_f16(b, 2, 0xBC00);  // m = -1
  b[4 + 3] = 0xA5;        // y[3] = 5 * 0.25 - 1, y[19] = 10 * 0.25 - 1
  b[4 + 15] = 0xFF;
  std::vector<float> y = dequantize(GgmlType::q4_1, b, 32);
  EXPECT_EQ(y[3], 0.25f);
  EXPECT_EQ(y[19], 1.5f);
  EXPECT_EQ(y[15], 2.75f);
  EXPECT_EQ(y[31], 2.75f);
  EXPECT_EQ(y[0], -1.0f);
}

TEST(GgmlType, Q8_0HandComputed) {
  std::vector<uint8_t> b(34 * 2, 0x00);
  put_f16(b, 0, 0x4000);  // d = 2
  b[2 + 0] = 0x80;        // -128
  b[2 + 31] = 0x7F;       // 127
  b[2 + 5] = 0xFF;        // -1
  put_f16(b, 34, 0xB800);  // second block: d = -0.5
  b[34 + 2 + 1] = 3;
  std::vector<float> y = dequantize(GgmlType::q8_0, b, 64);
  EXPECT_EQ(y[0], -256.0f);
  EXPECT_EQ(y[31], 254.0f);
  EXPECT_EQ(y[5], -2.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[33], -1.5f);
}

// The loader keeps Q5_0 as Q8_0 (model/model_loader.cpp): the same d, each code q - 16. Hand-computed codes at
// both ends of the 5-bit range, then random blocks (every bit pattern of the codes, random finite d): the Q8_0
// blocks dequantize to the Q5_0 blocks' values exactly.
TEST(GgmlType, Q5_0AsQ8_0HoldsTheSameValues) {
  std::vector<uint8_t> b(22, 0x00);
  put_f16(b, 0, 0xB400);  // d = -0.25
  b[2] = 0x01;            // qh bit 0: element 0's fifth bit
  b[6 + 0] = 0x0F;        // element 0: 15 | 16 = 31 -> 15; element 16: 0 -> -16
  std::vector<uint8_t> q8(34);
  q5_0_as_q8_0(b.data(), q8.data(), 1);
  EXPECT_EQ(q8[0], 0x00);
  EXPECT_EQ(q8[1], 0xB4);
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 0]), 15);
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 16]), -16);
  EXPECT_EQ(dequantize(GgmlType::q8_0, q8, 32), dequantize(GgmlType::q5_0, b, 32));

  constexpr int kBlocks = 64;
  std::vector<uint8_t> blocks(22 * kBlocks);
  uint32_t state = 12345;
  for (uint8_t& x : blocks) x = static_cast<uint8_t>((state = state * 1664525u + 1013904223u) >> 24);
  for (int i = 0; i < kBlocks; ++i) put_f16(blocks, 22 * i, static_cast<uint16_t>(0x2000 + 97 * i));  // finite d
  std::vector<uint8_t> converted(34 * kBlocks);
  q5_0_as_q8_0(blocks.data(), converted.data(), kBlocks);
  EXPECT_EQ(dequantize(GgmlType::q8_0, converted, 32 * kBlocks), dequantize(GgmlType::q5_0, blocks, 32 * kBlocks));
}

TEST(GgmlType, Q4_KHandComputed) {
  std::vector<uint8_t> b(144, 0x00);
  put_f16(b, 0, 0x3C00);  // d = 1
  put_f16(b, 2, 0x3800);  // dmin = 0.5
  uint8_t* scales = b.data() + 4;
  scales[0] = 3;                 // sub-block 0: scale 3
  scales[4] = 2;                 //              min 2
  scales[1] = 0x80 | 7;          // sub-block 1: scale 7; top bits 10 = high bits of sub-block 5's scale
  scales[5] = 0x40 | 4;          // sub-block 1: min 4; top bits 01 = high bits of sub-block 5's min
  scales[9] = 0x35;              // sub-block 5: scale low nibble 5 (-> 0x25 = 37), min low nibble 3 (-> 0x13 = 19)
  uint8_t* qs = b.data() + 16;
  qs[0] = 0x9A;       // chunk 0: y[0] from 0xA (sub-block 0), y[32] from 0x9 (sub-block 1)
  qs[64 + 2] = 0xB0;  // chunk 2: y[130] from 0x0 (sub-block 4), y[162] from 0xB (sub-block 5)
  std::vector<float> y = dequantize(GgmlType::q4_k, b, 256);
  EXPECT_EQ(y[0], 1.0f * 3 * 10 - 0.5f * 2);
  EXPECT_EQ(y[1], -1.0f);  // q = 0 in sub-block 0
  EXPECT_EQ(y[32], 1.0f * 7 * 9 - 0.5f * 4);
  EXPECT_EQ(y[162], 1.0f * 37 * 11 - 0.5f * 19);
  EXPECT_EQ(y[130], 0.0f);  // sub-block 4 has scale 0 and min 0
}

TEST(GgmlType, Q6_KHandComputed) {
  std::vector<uint8_t> b(210, 0x00);
  uint8_t* ql = b.data();
  uint8_t* qh = b.data() + 128;
  int8_t* sc = reinterpret_cast<int8_t*>(b.data() + 192);
  put_f16(b, 208, 0x3800);  // d = 0.5
  sc[0] = 2, sc[2] = -3, sc[4] = 1, sc[6] = 4, sc[9] = 5;
  ql[0] = 0x3F;   // low 15 -> y[0], high 3 -> y[64]
  ql[32] = 0x71;  // low 1 -> y[32], high 7 -> y[96]
  qh[0] = 2 | (1 << 2) | (0 << 4) | (3 << 6);
  ql[64 + 20] = 0x0C;  // second half, l = 20 (scale index 1 -> sc[8 + 1])
  qh[32 + 20] = 0x01;
  std::vector<float> y = dequantize(GgmlType::q6_k, b, 256);
  EXPECT_EQ(y[0], 0.5f * 2 * ((15 | (2 << 4)) - 32));
  EXPECT_EQ(y[32], 0.5f * -3 * ((1 | (1 << 4)) - 32));
  EXPECT_EQ(y[64], 0.5f * 1 * (3 - 32));
  EXPECT_EQ(y[96], 0.5f * 4 * ((7 | (3 << 4)) - 32));
  EXPECT_EQ(y[148], 0.5f * 5 * ((12 | 16) - 32));
  EXPECT_EQ(y[1], 0.5f * 2 * -32);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path << " (written by tools/make_dequant_fixtures.py)";
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Fixtures: random blocks and their dequantization by gguf-py (tools/make_dequant_fixtures.py).
class DequantFixture : public ::testing::TestWithParam<GgmlType> {};

TEST_P(DequantFixture, MatchesGgufPy) {
  const std::string name(ggml_type_name(GetParam()));
  const std::string base = test::source_path("tests/fixtures/dequant/" + name);
  const std::vector<uint8_t> blocks = read_bytes(base + ".blocks");
  const std::vector<uint8_t> expected_bytes = read_bytes(base + ".f32");
  ASSERT_FALSE(expected_bytes.empty());
  const int64_t n = static_cast<int64_t>(expected_bytes.size() / 4);
  ASSERT_EQ(ggml_row_bytes(GetParam(), n), blocks.size());
  std::vector<float> expected(static_cast<size_t>(n));
  std::memcpy(expected.data(), expected_bytes.data(), expected_bytes.size());
  const std::vector<float> got = dequantize(GetParam(), blocks, n);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(expected[i])) {
      EXPECT_EQ(got[i], expected[i]) << name << " value " << i;
    } else {
      // Bit-exact in practice; the margin allows a fused multiply-add on other targets.
      EXPECT_NEAR(got[i], expected[i], 1e-6f * std::fabs(expected[i]) + 1e-30f) << name << " value " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllSupportedTypes, DequantFixture,
                         ::testing::Values(GgmlType::f16, GgmlType::bf16, GgmlType::q4_0, GgmlType::q4_1,
                                           GgmlType::q5_0, GgmlType::q5_1, GgmlType::q8_0, GgmlType::q4_k,
                                           GgmlType::q5_k, GgmlType::q6_k),
                         [](const auto& info) { return std::string(ggml_type_name(info.param)); });

}  // namespace
}  // namespace strata
