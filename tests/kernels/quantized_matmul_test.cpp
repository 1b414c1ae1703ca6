// The CPU backend's quantized weights (kernels/cpu/packed_weight.h) and kernels (kernels/cpu/quantized_matmul.h,
// quantized_dot.h) on random blocks of every format, against a double-precision product of the dequantized weight
// (dequantize_weight_row, itself checked against hand-computed blocks in tests/model/ggml_type_test.cpp).
//
// Tolerance: both paths dequantize exactly (y = d * u + m rounds as the format's own dequantization does) and
// multiply in fp32, so each output is within a few fp32 roundings of the exact sum: 1e-5 of sum |w x| (about 80
// roundings of 2^-24 in the worst case of these lengths; the sums are ordered differently per level and path).
// With int8 or int16 activations (kernels/cpu/integer_activations.h) the reference multiplies the rounded values
// d * q, which the integer kernels take exactly; the rounding itself is checked against hand-computed blocks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/cpu/amx_probe.h"
#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/packed_weight.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/quantized_matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/random_weight_blocks.h"

namespace strata {
namespace {

using cpu::CpuIsa;
using test::random_blocks;

// Activations with a spread of magnitudes, and a few outliers as real models have.
std::vector<float> random_activations(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % 97 == 5 ? 20.0f : 1.0f);
  return x;
}

struct Reference {
  std::vector<double> value;  // [rows of x][rows of w]
  std::vector<double> scale;  // sum |w x| per output
};

Reference reference(const WeightMatrix& w, const std::vector<float>& x, int64_t n_x) {
  Reference ref;
  std::vector<float> row(size_t(w.cols));
  for (int64_t a = 0; a < n_x; ++a) {
    for (int64_t i = 0; i < w.rows; ++i) {
      dequantize_weight_row(w.format, w.row(i), row.data(), w.cols);
      double dot = 0, scale = 0;
      for (int64_t j = 0; j < w.cols; ++j) {
        dot += double(row[j]) * x[size_t(a * w.cols + j)];
        scale += std::fabs(double(row[j]) * x[size_t(a * w.cols + j)]);
      }
      ref.value.push_back(dot);
      ref.scale.push_back(scale);
    }
  }
  return ref;
}

void expect_near_reference(const std::vector<float>& out, const Reference& ref, const std::string& what) {
  ASSERT_EQ(out.size(), ref.value.size()) << what;
  for (size_t k = 0; k < out.size(); ++k) {
    ASSERT_NEAR(out[k], ref.value[k], 1e-5 * ref.scale[k] + 1e-30) << what << ", output " << k;
  }
}

struct Case {
  WeightFormat format;
  int64_t rows, cols;
};

// Odd block counts for the 32-value formats (a pair group with one block), two super-blocks for the k-quants.
const Case kCases[] = {
    {WeightFormat::q8_0, 37, 96},  {WeightFormat::q8_0, 70, 576}, {WeightFormat::q4_0, 37, 96},
    {WeightFormat::q4_0, 33, 576}, {WeightFormat::q4_1, 37, 96},  {WeightFormat::q4_1, 40, 1536},
    {WeightFormat::q4_k, 35, 512}, {WeightFormat::q5_k, 35, 512}, {WeightFormat::q6_k, 35, 512},
    {WeightFormat::q5_1, 37, 96},  {WeightFormat::q5_1, 40, 576},
    {WeightFormat::f16, 37, 96},   {WeightFormat::f16, 40, 576},  {WeightFormat::bf16, 37, 96},
    {WeightFormat::bf16, 33, 1536},
};

// f16 and bf16 rows of any length: a remainder of single vectors and of values one by one (100 = 64 + 32 + 4 on
// AVX-512, 96 + 4 on AVX2), and rows shorter than a vector.
const Case kHalfAnyLengthCases[] = {
    {WeightFormat::f16, 5, 100}, {WeightFormat::bf16, 3, 100}, {WeightFormat::f16, 4, 7}, {WeightFormat::bf16, 2, 23},
};

// Rows a multiple of 16, for the 16-row tiles of the int8 VNNI kernel: an odd block count, a second tile; the
// k-quants with one and three super-blocks.
const Case kRows16Cases[] = {
    {WeightFormat::q8_0, 48, 96},   {WeightFormat::q4_0, 32, 576}, {WeightFormat::q4_1, 16, 96},
    {WeightFormat::q4_1, 64, 1536}, {WeightFormat::q8_0, 32, 1536}, {WeightFormat::q4_k, 16, 256},
    {WeightFormat::q4_k, 48, 768},  {WeightFormat::q5_k, 16, 256},  {WeightFormat::q5_k, 48, 768},
    {WeightFormat::q6_k, 16, 256},  {WeightFormat::q6_k, 32, 768},  {WeightFormat::q5_1, 16, 96},
    {WeightFormat::q5_1, 48, 576},
};

int digits_of(ActivationDtype dtype) { return dtype == ActivationDtype::int16 ? 2 : 1; }
std::string dtype_name(ActivationDtype dtype) { return dtype == ActivationDtype::int16 ? "int16" : "int8"; }

std::string name(const Case& c) {
  return std::string(weight_format_info(c.format).name) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols);
}

// Every row of `packed` (made from w) dequantizes to the format's own values.
void expect_dequantizes_to_format_values(const cpu::PackedWeight& packed, const WeightMatrix& w,
                                         const std::string& what) {
  std::vector<float> got(size_t(w.rows * w.cols)), want(size_t(w.cols));
  cpu::dequantize_rows(packed, 0, w.rows, got.data());
  for (int64_t i = 0; i < w.rows; ++i) {
    dequantize_weight_row(w.format, w.row(i), want.data(), w.cols);
    for (int64_t j = 0; j < w.cols; ++j) {
      ASSERT_EQ(got[size_t(i * w.cols + j)], want[size_t(j)]) << what << " at " << i << ", " << j;
    }
  }
}

TEST(PackedWeight, DequantizesToTheFormatsOwnValues) {
  for (const Case& c : kCases) {
    const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 11);
    const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
    const cpu::OwnedPackedWeight packed = cpu::pack_weight(w);
    expect_dequantizes_to_format_values(packed.view, w, name(c));
  }
}

// The levels whose integer kernels multiply 16-row tiles: the AMX one, the VNNI one, the AVX2 one (which AVX-512
// without VNNI runs too), and the baseline one, their reference.
std::vector<CpuIsa> rows16_levels_here() {
  std::vector<CpuIsa> levels = {CpuIsa::baseline};
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512_vnni, CpuIsa::amx}) {
    if (cpu::cpu_supports(isa) && cpu::quantized_dot(isa) != nullptr) {
      levels.push_back(isa);
    } else {
      std::cout << "[ skipped ] " << cpu::cpu_isa_name(isa) << ": not on this machine" << std::endl;
    }
  }
  return levels;
}

std::vector<CpuIsa> levels_here() {
  std::vector<CpuIsa> levels;
  for (CpuIsa isa : cpu::kCpuIsas) {
    if (cpu::cpu_supports(isa) && cpu::quantized_dot(isa) != nullptr) {
      levels.push_back(isa);
    } else {
      std::cout << "[ skipped ] " << cpu::cpu_isa_name(isa) << ": not on this machine" << std::endl;
    }
  }
  return levels;
}

TEST(QuantizedMatmul, FusedKernelsOfEveryLevelMatchTheReference) {
  for (CpuIsa isa : levels_here()) {
    for (const Case& c : kCases) {
      const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 21);
      const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
      const cpu::OwnedPackedWeight packed = cpu::pack_weight(w);
      for (int64_t n_x : {1, 2, 3, 8, 13}) {  // every row tile of the kernels, and a second tile
        const std::vector<float> x = random_activations(n_x, c.cols, 22);
        std::vector<float> out(size_t(n_x * c.rows), NAN);
        cpu::quantized_matmul_fused(x.data(), n_x, packed.view, out.data(), isa);
        expect_near_reference(out, reference(w, x, n_x),
                              name(c) + " on " + std::string(cpu::cpu_isa_name(isa)) + ", rows of x " +
                                  std::to_string(n_x));
      }
    }
  }
}

TEST(QuantizedMatmul, HalfRowsOfAnyLengthMatchTheReference) {
  for (const Case& c : kHalfAnyLengthCases) {
    const std::vector<uint8_t> values = random_blocks(c.format, c.rows, c.cols, 25);
    const WeightMatrix w{values.data(), c.format, c.rows, c.cols};
    const cpu::OwnedPackedWeight packed = cpu::pack_weight(w);
    for (CpuIsa isa : levels_here()) {
      for (int64_t n_x : {1, 3, 9}) {
        const std::vector<float> x = random_activations(n_x, c.cols, 26);
        std::vector<float> out(size_t(n_x * c.rows), NAN);
        cpu::quantized_matmul_fused(x.data(), n_x, packed.view, out.data(), isa);
        expect_near_reference(out, reference(w, x, n_x),
                              name(c) + " on " + std::string(cpu::cpu_isa_name(isa)) + ", rows of x " +
                                  std::to_string(n_x));
      }
    }
    const int64_t n_x = cpu::kDequantizedTileMinRows + 1;
    const std::vector<float> x = random_activations(n_x, c.cols, 27);
    std::vector<float> out(size_t(n_x * c.rows), NAN);
    cpu::quantized_matmul(x.data(), n_x, packed.view, out.data());  // many rows: the fp32 tiles
    expect_near_reference(out, reference(w, x, n_x), name(c) + " in fp32 tiles");
  }
}

TEST(QuantizedMatmul, DequantizedTilesMatchTheReference) {
  for (const Case& c : kCases) {
    const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 41);
    const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
    const int64_t n_x = cpu::kDequantizedTileMinRows + 3;
    const std::vector<float> x = random_activations(n_x, c.cols, 42);
    const cpu::OwnedPackedWeight packed = cpu::pack_weight(w);
    std::vector<float> out(size_t(n_x * c.rows));
    cpu::quantized_matmul(x.data(), n_x, packed.view, out.data());  // many rows: the fp32 tiles
    expect_near_reference(out, reference(w, x, n_x), name(c) + " in fp32 tiles");
  }
}

// Two rows of 96 values (three blocks: the second pair group holds one), by hand: block 0 of row 0 has max |x| 2.54,
// so d = 0.02 and x = 0.05 is 2.5 d, which rounds to the even 2 (ties to even); a zero block has d = 0 and q = 0.
TEST(IntegerActivations, RoundPerBlockOf32AsDefined) {
  std::vector<float> x(2 * 96, 0.0f);
  x[0] = 2.54f;   // 127 d
  x[1] = -1.27f;  // -63.5 d: the tie goes to -64
  x[2] = 0.05f;   // 2.5 d -> 2
  x[3] = 0.07f;   // 3.5 d -> 4
  x[64] = -4.0f;  // block 2 (the lone block of group 1): d = 4 / 127, q = -127
  x[64 + 1] = 1.0f;  // 31.75 d -> 32
  x[96 + 33] = 1.0f;  // row 1, block 1: d = 1 / 127, q = 127; its blocks 0 and 2 are zero
  cpu::IntegerActivations r;
  std::vector<float> x_hat(x.size());
  cpu::round_activations(x.data(), 2, 96, 1, r, x_hat.data());
  ASSERT_EQ(r.groups, 2);
  EXPECT_TRUE(r.q_low.empty());
  const float d0 = 2.54f / 127.0f, d2 = 4.0f / 127.0f, d_row1 = 1.0f / 127.0f;
  const int8_t* q0 = r.row_values(0);
  EXPECT_EQ(q0[0], 127);
  EXPECT_EQ(q0[1], -64);
  EXPECT_EQ(q0[2], 2);
  EXPECT_EQ(q0[3], 4);
  EXPECT_EQ(q0[4], 0);
  EXPECT_EQ(q0[64], -127);
  EXPECT_EQ(q0[65], 32);
  EXPECT_EQ(q0[96], 0);  // the padding after the lone block
  const float* s0 = r.row_scales(0);
  EXPECT_FLOAT_EQ(s0[0], d0);
  EXPECT_EQ(s0[1], 0.0f);  // block 1 of row 0 is zero
  EXPECT_FLOAT_EQ(s0[2], d0 * (127 - 64 + 2 + 4));
  EXPECT_EQ(s0[3], 0.0f);
  EXPECT_FLOAT_EQ(s0[4], d2);
  EXPECT_EQ(s0[5], 0.0f);  // no block 3
  EXPECT_FLOAT_EQ(s0[6], d2 * (-127 + 32));
  const int8_t* q1 = r.row_values(1);
  EXPECT_EQ(q1[33], 127);
  EXPECT_FLOAT_EQ(r.row_scales(1)[1], d_row1);
  EXPECT_FLOAT_EQ(x_hat[1], -64 * d0);
  EXPECT_FLOAT_EQ(x_hat[65], 32 * d2);
  EXPECT_FLOAT_EQ(x_hat[96 + 33], 127 * d_row1);
}

// Int16 by hand: a block whose max |x| is 31.75 = 32512 / 1024 has d = 2^-10, so x = k / 1024 is the integer k
// exactly, split as k = 256 q_high + q_low with q_low in [-128, 127]; ties go to even.
TEST(IntegerActivations, Int16RoundsPerBlockOf32IntoTwoDigitsAsDefined) {
  std::vector<float> x(64, 0.0f);
  const float d = 1.0f / 1024.0f;
  const struct {
    int at;
    float k;             // x = k d
    int8_t high, low;    // the digits of round(k)
  } cases[] = {
      {0, 32512, 127, 0},     // max |x|: 127 x 256
      {1, -32512, -127, 0},   // floor((-32512 + 128) / 256) = -127
      {2, 12345, 48, 57},     // 48 x 256 + 57
      {3, -129, -1, 127},     // -256 + 127
      {4, -128, 0, -128},
      {5, 127.5f, 1, -128},   // the tie goes to the even 128 = 256 - 128
      {6, 2.5f, 0, 2},        // a tie to the even 2
      {7, 3.5f, 0, 4},
      {33, 1000, 4, -24},     // block 1: its own max, d = 1000 / 32512
  };
  for (const auto& c : cases) x[size_t(c.at)] = c.k * d;
  x[33] = 1.0f;  // block 1 alone: d1 = 1 / 32512, q = 32512
  cpu::IntegerActivations r;
  std::vector<float> x_hat(x.size());
  cpu::round_activations(x.data(), 1, 64, 2, r, x_hat.data());
  ASSERT_EQ(r.digits, 2);
  const int8_t* high = r.row_values(0);
  const int8_t* low = r.row_low_values(0);
  for (const auto& c : cases) {
    if (c.at >= 32) continue;
    const int q = 256 * high[c.at] + low[c.at];
    EXPECT_EQ(high[c.at], c.high) << "at " << c.at;
    EXPECT_EQ(low[c.at], c.low) << "at " << c.at;
    EXPECT_FLOAT_EQ(x_hat[size_t(c.at)], float(q) * d) << "at " << c.at;
  }
  EXPECT_EQ(high[33], 127);
  EXPECT_EQ(low[33], 0);
  EXPECT_FLOAT_EQ(r.row_scales(0)[0], d);
  EXPECT_FLOAT_EQ(r.row_scales(0)[1], 1.0f / 32512.0f);
  EXPECT_FLOAT_EQ(r.row_scales(0)[2], d * float(32512 - 32512 + 12345 - 129 - 128 + 128 + 2 + 4));
}

// Rounded values lie within d / 2 of x, d = max |x| / 127 (int8) or / 32512 (int16), and the digits stand for them.
TEST(IntegerActivations, RoundedValuesLieWithinHalfAStepOfTheInput) {
  const std::vector<float> x = random_activations(3, 576, 5);
  for (int digits : {1, 2}) {
    cpu::IntegerActivations r;
    std::vector<float> x_hat(x.size());
    cpu::round_activations(x.data(), 3, 576, digits, r, x_hat.data());
    for (int64_t a = 0; a < 3; ++a) {
      for (int64_t b = 0; b < 576 / 32; ++b) {
        const float d = r.row_scales(a)[4 * (b / 2) + b % 2];
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(a * 576 + 32 * b + j)]));
        EXPECT_FLOAT_EQ(d, amax / (digits == 2 ? 32512.0f : 127.0f));
        for (int j = 0; j < 32; ++j) {
          const int64_t v = a * 576 + 32 * b + j, at = a * r.groups * 64 + 32 * b + j;
          const int q = digits == 2 ? 256 * r.q[size_t(at)] + r.q_low[size_t(at)] : r.q[size_t(at)];
          EXPECT_EQ(x_hat[size_t(v)], d * float(q));
          EXPECT_LE(std::fabs(x_hat[size_t(v)] - x[size_t(v)]), 0.5001f * d) << digits << " digits at " << v;
        }
      }
    }
  }
}

// The integer kernel of `isa` against the reference on the rounded values (one digit, int8, or two, int16), for
// every case packed as `packing`, at every row tile of every level and a second tile (AMX's of 16 rows: whole,
// with a part, and several).
void expect_integer_kernel_near_reference(CpuIsa isa, std::span<const Case> cases, cpu::PairPacking packing,
                                          int digits, uint32_t seed) {
  for (const Case& c : cases) {
    const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, seed);
    const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
    const cpu::OwnedPackedWeight packed = cpu::pack_weight(w, packing);
    for (int64_t n_x : {1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 37}) {
      const std::vector<float> x = random_activations(n_x, c.cols, seed + 1);
      cpu::IntegerActivations rounded;
      std::vector<float> x_hat(x.size());
      cpu::round_activations(x.data(), n_x, c.cols, digits, rounded, x_hat.data());
      std::vector<float> out(size_t(n_x * c.rows), NAN);
      cpu::quantized_matmul_integer(rounded, x_hat.data(), packed.view, out.data(), isa);
      expect_near_reference(out, reference(w, x_hat, n_x),
                            name(c) + (packing == cpu::PairPacking::rows16 ? " rows16" : " pairs") +
                                (digits == 2 ? " int16 on " : " int8 on ") + std::string(cpu::cpu_isa_name(isa)) +
                                ", rows of x " + std::to_string(n_x));
    }
  }
}

TEST(QuantizedMatmul, Int8KernelsOfEveryLevelMatchTheReferenceOnTheRoundedValues) {
  for (CpuIsa isa : levels_here()) {
    for (int digits : {1, 2}) expect_integer_kernel_near_reference(isa, kCases, cpu::PairPacking::pairs, digits, 23);
  }
}

TEST(PackedWeight, Rows16TilesDequantizeToTheFormatsOwnValuesAtThePairsSize) {
  for (const Case& c : kRows16Cases) {
    const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 12);
    const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
    const cpu::OwnedPackedWeight packed = cpu::pack_weight(w, cpu::PairPacking::rows16);
    ASSERT_TRUE(cpu::is_rows16(packed.view.layout)) << name(c);
    // 20 (u4) or 36 (u8: Q8_0, Q5_1) bytes per row and block of 32, as a pair group's half; Q4_K 148 per
    // super-block, its own 144 and 4 for the scales unpacked to bytes; Q5_K 180, its own 176 and the same 4; Q6_K
    // its own 210.
    const int64_t row_bytes = c.format == WeightFormat::q4_k   ? c.cols / 256 * 148
                              : c.format == WeightFormat::q5_k ? c.cols / 256 * 180
                              : c.format == WeightFormat::q6_k ? c.cols / 256 * 210
                                                               : c.cols / 32 * (cpu::held_as_u8(c.format) ? 36 : 20);
    EXPECT_EQ(packed.view.row_bytes, row_bytes) << name(c);
    expect_dequantizes_to_format_values(packed.view, w, name(c));
  }
  // Rows that are not a multiple of 16 stay in pairs.
  const std::vector<uint8_t> blocks = random_blocks(WeightFormat::q4_1, 40, 96, 13);
  EXPECT_EQ(cpu::pack_weight(WeightMatrix{blocks.data(), WeightFormat::q4_1, 40, 96}, cpu::PairPacking::rows16)
                .view.layout,
            cpu::PackedLayout::u4_pairs);
}

TEST(QuantizedMatmul, IntegerKernelsOnRows16TilesMatchTheReferenceOnTheRoundedValues) {
  for (CpuIsa isa : rows16_levels_here()) {
    for (int digits : {1, 2}) expect_integer_kernel_near_reference(isa, kRows16Cases, cpu::PairPacking::rows16, digits, 25);
  }
}

// The integer kernels of levels `a` and `b` on c's 16-row tiles give the same floats, digit for digit, with one
// digit and two, at each of `rows_of_x`.
void expect_same_floats(CpuIsa a, CpuIsa b, const Case& c, std::initializer_list<int64_t> rows_of_x, uint32_t seed) {
  const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, seed);
  const cpu::OwnedPackedWeight packed =
      cpu::pack_weight(WeightMatrix{blocks.data(), c.format, c.rows, c.cols}, cpu::PairPacking::rows16);
  for (int digits : {1, 2}) {
    for (int64_t n_x : rows_of_x) {
      const std::vector<float> x = random_activations(n_x, c.cols, seed + 1);
      cpu::IntegerActivations rounded;
      cpu::round_activations(x.data(), n_x, c.cols, digits, rounded, nullptr);
      std::vector<float> out_a(size_t(n_x * c.rows), NAN), out_b(out_a.size(), NAN);
      cpu::quantized_dot_int8(a)(packed.view, 0, c.rows, rounded, out_a.data(), c.rows);
      cpu::quantized_dot_int8(b)(packed.view, 0, c.rows, rounded, out_b.data(), c.rows);
      EXPECT_EQ(out_a, out_b) << name(c) << " on " << cpu::cpu_isa_name(a) << " and " << cpu::cpu_isa_name(b) << ", "
                              << digits << " digits, rows of x " << n_x;
    }
  }
}

// The AVX2 tile kernel sums every block exactly in 32 bits and then converts, scales and adds in the VNNI kernel's
// order: on a machine with both, the two give the same floats, digit for digit, at every row count.
TEST(QuantizedMatmul, Avx2AndVnniTileKernelsGiveTheSameFloats) {
  if (!cpu::cpu_supports(CpuIsa::avx512_vnni) || cpu::quantized_dot(CpuIsa::avx512_vnni) == nullptr) {
    GTEST_SKIP() << "not an AVX-512 VNNI machine";
  }
  for (const Case& c : kRows16Cases) {
    if (cpu::held_as_u8(c.format)) continue;  // no u8 tiles at the AVX2 level (the baseline kernel's)
    expect_same_floats(CpuIsa::avx2, CpuIsa::avx512_vnni, c, {1, 3, 8, 13}, 71);
  }
}

// The AMX kernel sums each block exactly in 32 bits, as the VNNI one does, and converts, scales and adds in the
// same order: the two give the same floats, digit for digit, from kAmxMinRows rows of x (fewer go to the VNNI
// kernel): one activation tile, a part of one, several; ten weight tiles of 48 blocks, more than it makes at once;
// rows of 72 and 80 blocks, more than one pass over the activation tiles.
TEST(QuantizedMatmul, AmxAndVnniTileKernelsGiveTheSameFloats) {
  if (!cpu::cpu_supports(CpuIsa::amx)) GTEST_SKIP() << "AMX is not usable here: " << cpu::amx_summary();
  std::vector<Case> cases(std::begin(kRows16Cases), std::end(kRows16Cases));
  cases.push_back({WeightFormat::q4_0, 160, 1536});
  cases.push_back({WeightFormat::q4_k, 32, 2304});
  cases.push_back({WeightFormat::q8_0, 32, 2560});
  for (const Case& c : cases) {
    expect_same_floats(CpuIsa::avx512_vnni, CpuIsa::amx, c, {cpu::kAmxMinRows, cpu::kAmxMinRows + 5, 29, 37}, 73);
  }
}

// Every path through quantized_matmul (the int8 kernel for few rows, the fp32 tiles for many) and every thread
// count give the 16-row tiles the numbers of the reference; they never reach the fp32 fused kernels.
TEST(QuantizedMatmul, Rows16TilesTakeEveryPathAndThreadCount) {
  const int saved = cpu::compute_pool().size();
  for (const Case& c : kRows16Cases) {
    const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 45);
    const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
    const cpu::OwnedPackedWeight packed = cpu::pack_weight(w, cpu::PairPacking::rows16);
    for (ActivationDtype dtype : {ActivationDtype::int8, ActivationDtype::int16}) {
      for (int64_t n_x : {int64_t(2), cpu::kDequantizedTileMinRows + 3}) {
        const std::vector<float> x = random_activations(n_x, c.cols, 46);
        cpu::IntegerActivations rounded;
        std::vector<float> x_hat(x.size());
        cpu::round_activations(x.data(), n_x, c.cols, digits_of(dtype), rounded, x_hat.data());
        std::vector<float> first;
        for (int threads : {1, 2, 3, 5}) {
          cpu::set_compute_threads(threads);
          std::vector<float> out(size_t(n_x * c.rows), NAN);
          cpu::quantized_matmul(x.data(), n_x, packed.view, out.data(), dtype);
          expect_near_reference(out, reference(w, x_hat, n_x),
                                name(c) + " rows16 " + dtype_name(dtype) + ", rows of x " + std::to_string(n_x));
          if (first.empty()) first = out;
          EXPECT_EQ(out, first) << name(c) << ", " << threads << " threads";
        }
      }
    }
    std::vector<float> out(size_t(c.rows));
    const std::vector<float> x = random_activations(1, c.cols, 47);
    EXPECT_THROW(cpu::quantized_matmul_fused(x.data(), 1, packed.view, out.data(), cpu::best_cpu_isa()),
                 std::logic_error);
  }
  cpu::set_compute_threads(saved);
}

// Through quantized_matmul every path (the int8 kernels for few rows, the fp32 kernels on the rounded values for the
// k-quants and for int16 on pairs, fp32 tiles for many rows) multiplies the same rounded values; f16 and bf16
// weights multiply x itself on every path.
TEST(QuantizedMatmul, IntegerActivationsTakeEveryPathToTheRoundedValues) {
  for (ActivationDtype dtype : {ActivationDtype::int8, ActivationDtype::int16}) {
    for (const Case& c : kCases) {
      const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 43);
      const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
      const cpu::OwnedPackedWeight packed = cpu::pack_weight(w);
      for (int64_t n_x : {int64_t(3), cpu::kDequantizedTileMinRows + 3}) {
        const std::vector<float> x = random_activations(n_x, c.cols, 44);
        cpu::IntegerActivations rounded;
        std::vector<float> x_hat(x.size());
        cpu::round_activations(x.data(), n_x, c.cols, digits_of(dtype), rounded, x_hat.data());
        std::vector<float> out(size_t(n_x * c.rows), NAN);
        cpu::quantized_matmul(x.data(), n_x, packed.view, out.data(), dtype);
        const std::string what = name(c) + " " + dtype_name(dtype) + ", rows of x " + std::to_string(n_x);
        expect_near_reference(out, reference(w, cpu::is_half(packed.view.layout) ? x : x_hat, n_x), what);
        // and through the shared-input door, as the backend calls it for Q, K and V
        const cpu::PackedWeight* weights[] = {&packed.view};
        std::vector<float> shared(out.size(), NAN);
        float* outputs[] = {shared.data()};
        cpu::quantized_matmul_shared_input(x.data(), n_x, weights, outputs, dtype);
        EXPECT_EQ(shared, out) << what;
      }
    }
  }
}

TEST(QuantizedMatmul, ThreadCountsGiveTheSameNumbers) {
  const Case c{WeightFormat::q8_0, 300, 576};
  const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 51);
  const cpu::OwnedPackedWeight packed = cpu::pack_weight(WeightMatrix{blocks.data(), c.format, c.rows, c.cols});
  const std::vector<float> x = random_activations(2, c.cols, 52);
  const int saved = cpu::compute_pool().size();
  std::vector<float> first;
  for (int threads : {1, 2, 3, 5}) {
    cpu::set_compute_threads(threads);
    std::vector<float> out(size_t(2 * c.rows));
    cpu::quantized_matmul(x.data(), 2, packed.view, out.data());
    if (first.empty()) first = out;
    EXPECT_EQ(out, first) << threads << " threads";  // each output is computed whole by one thread
  }
  cpu::set_compute_threads(saved);
}

// The backend's embedding of rows `ids` of an uploaded `table` (made from w) gives the format's own values.
void expect_embedding_of_format_values(Backend& be, const Tensor& table, const WeightMatrix& w,
                                       const std::vector<int32_t>& ids) {
  Tensor embedded = be.alloc(int64_t(ids.size()), w.cols, DType::f32);
  be.embedding(ids, table, embedded);
  std::vector<float> got(ids.size() * size_t(w.cols)), want(size_t(w.cols));
  be.copy_to_host(embedded, got.data());
  for (size_t t = 0; t < ids.size(); ++t) {
    dequantize_weight_row(w.format, w.row(ids[t]), want.data(), w.cols);
    for (int64_t j = 0; j < w.cols; ++j) ASSERT_EQ(got[t * size_t(w.cols) + size_t(j)], want[size_t(j)]) << ids[t];
  }
  be.free(embedded);
}

TEST(CpuBackendWeights, QuantizedUploadsFeedMatmulAndEmbedding) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  const Case c{WeightFormat::q4_1, 48, 96};
  const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 61);
  const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
  const Tensor table = be->upload_weight(w);
  EXPECT_EQ(table.dtype, DType::packed);
  EXPECT_EQ(be->uploaded_weight_bytes(w), c.rows * 2 * cpu::kU4PairBytes);  // 3 blocks: two pair groups

  // The same matrix again, and a range of its rows (a vocabulary-parallel slice of a tied head), share the upload.
  EXPECT_EQ(be->upload_weight(w).data, table.data);
  const WeightMatrix rows{w.row(16), c.format, 16, c.cols};
  const Tensor slice = be->upload_weight(rows);
  EXPECT_NE(slice.data, table.data);

  expect_embedding_of_format_values(*be, table, w, {17, 0, 47});

  // The slice's rows are rows 16..31 of the whole: the same outputs as those columns of the whole product.
  const std::vector<float> x = random_activations(2, c.cols, 62);
  Tensor tx = be->alloc(2, c.cols, DType::f32), whole = be->alloc(2, c.rows, DType::f32), part = be->alloc(2, 16, DType::f32);
  be->copy_from_host(x.data(), tx);
  be->matmul(tx, table, whole);
  be->matmul(tx, slice, part);
  std::vector<float> w_out(size_t(2 * c.rows)), p_out(32);
  be->copy_to_host(whole, w_out.data());
  be->copy_to_host(part, p_out.data());
  for (int a = 0; a < 2; ++a) {
    for (int i = 0; i < 16; ++i) EXPECT_EQ(p_out[size_t(a * 16 + i)], w_out[size_t(a * c.rows + 16 + i)]);
  }
}

// The k-quants too: k4_rows16, k5_rows16 and k6_rows16 tiles with integer activations on x86-64-v3 and up (Q4_K's
// and Q5_K's 6-bit scales unpacked: 148 and 180 bytes per row and super-block; Q6_K at its own 210), their own
// blocks in place with fp32 activations.
TEST(CpuBackendWeights, IntegerActivationsHoldKQuantsAsRows16Tiles) {
  if (cpu::best_cpu_isa() == CpuIsa::baseline) GTEST_SKIP() << "no x86-64-v3";
  struct KQuant {
    WeightFormat format;
    cpu::PackedLayout tiles, in_place;
    int64_t super_block_bytes;
  };
  for (const KQuant k : {KQuant{WeightFormat::q4_k, cpu::PackedLayout::k4_rows16, cpu::PackedLayout::q4_k, 148},
                         KQuant{WeightFormat::q5_k, cpu::PackedLayout::k5_rows16, cpu::PackedLayout::q5_k, 180},
                         KQuant{WeightFormat::q6_k, cpu::PackedLayout::k6_rows16, cpu::PackedLayout::q6_k, 210}}) {
    const Case c{k.format, 32, 512};
    const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 65);
    const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
    std::unique_ptr<Backend> int8 = make_cpu_backend(ActivationDtype::int8);
    EXPECT_EQ(static_cast<const cpu::PackedWeight*>(int8->upload_weight(w).data)->layout, k.tiles) << name(c);
    EXPECT_EQ(int8->uploaded_weight_bytes(w), c.rows * 2 * k.super_block_bytes) << name(c);
    std::unique_ptr<Backend> f32 = make_cpu_backend(ActivationDtype::f32);
    EXPECT_EQ(static_cast<const cpu::PackedWeight*>(f32->upload_weight(w).data)->layout, k.in_place) << name(c);
  }
}

// Which 32-value formats integer activations hold as tiles at each level this machine has (limit_cpu_isa, as
// engine.cpu_kernels sets it): Q4_0 and Q4_1 from AVX2, Q8_0 on VNNI only; none at baseline.
TEST(CpuBackendWeights, IntegerActivationsHoldTheFormatsTheLevelsKernelsTile) {
  const CpuIsa best = cpu::best_cpu_isa();
  for (CpuIsa level : cpu::kCpuIsas) {
    if (!cpu::cpu_supports(level)) continue;
    cpu::limit_cpu_isa(level);
    ASSERT_EQ(cpu::best_cpu_isa(), level);
    std::unique_ptr<Backend> be = make_cpu_backend(ActivationDtype::int16);
    for (WeightFormat format : {WeightFormat::q4_0, WeightFormat::q4_1, WeightFormat::q8_0}) {
      const std::vector<uint8_t> blocks = random_blocks(format, 32, 96, 66);
      const Tensor t = be->upload_weight(WeightMatrix{blocks.data(), format, 32, 96});
      const bool tiles = level >= CpuIsa::avx512_vnni || (level != CpuIsa::baseline && format != WeightFormat::q8_0);
      EXPECT_EQ(cpu::is_rows16(static_cast<const cpu::PackedWeight*>(t.data)->layout), tiles)
          << weight_format_info(format).name << " at " << cpu::cpu_isa_name(level);
    }
  }
  cpu::limit_cpu_isa(CpuIsa::amx);  // no limit: the machine's best again
  EXPECT_EQ(cpu::best_cpu_isa(), best);
}

// With int8 activations an x86-64-v3 machine or better holds Q4_1 as 16-row tiles: a range of whole tiles (a
// vocabulary-parallel slice) shares the upload, one that cuts a tile is packed on its own; both multiply and embed
// as the whole matrix does.
TEST(CpuBackendWeights, IntegerActivationsHoldRows16Tiles) {
  if (cpu::best_cpu_isa() == CpuIsa::baseline) GTEST_SKIP() << "no x86-64-v3";
  std::unique_ptr<Backend> be = make_cpu_backend(ActivationDtype::int8);
  const Case c{WeightFormat::q4_1, 64, 96};
  const std::vector<uint8_t> blocks = random_blocks(c.format, c.rows, c.cols, 63);
  const WeightMatrix w{blocks.data(), c.format, c.rows, c.cols};
  const Tensor table = be->upload_weight(w);
  EXPECT_TRUE(cpu::is_rows16(static_cast<const cpu::PackedWeight*>(table.data)->layout));
  EXPECT_EQ(be->uploaded_weight_bytes(w), c.rows * 3 * 20);  // 20 bytes per row and block; no pair to pad

  expect_embedding_of_format_values(*be, table, w, {17, 0, 63});

  const std::vector<float> x = random_activations(2, c.cols, 64);
  Tensor tx = be->alloc(2, c.cols, DType::f32), whole = be->alloc(2, c.rows, DType::f32);
  be->copy_from_host(x.data(), tx);
  be->matmul(tx, table, whole);
  std::vector<float> w_out(size_t(2 * c.rows));
  be->copy_to_host(whole, w_out.data());
  const auto* whole_rows = static_cast<const cpu::PackedWeight*>(table.data);
  for (int64_t first_row : {16, 8}) {  // whole tiles 1 and 2; half of tile 0 and half of tile 1
    const WeightMatrix rows{w.row(first_row), c.format, 32, c.cols};
    const Tensor slice = be->upload_weight(rows);
    const auto* slice_rows = static_cast<const cpu::PackedWeight*>(slice.data);
    EXPECT_TRUE(cpu::is_rows16(slice_rows->layout));
    const bool shared = slice_rows->data == whole_rows->data + first_row * whole_rows->row_bytes;
    EXPECT_EQ(shared, first_row % 16 == 0) << "rows from " << first_row;
    Tensor part = be->alloc(2, 32, DType::f32);
    be->matmul(tx, slice, part);
    std::vector<float> p_out(64);
    be->copy_to_host(part, p_out.data());
    for (int a = 0; a < 2; ++a) {
      for (int i = 0; i < 32; ++i) {
        EXPECT_NEAR(p_out[size_t(a * 32 + i)], w_out[size_t(a * c.rows + first_row + i)],
                    1e-5f * std::fabs(w_out[size_t(a * c.rows + first_row + i)]) + 1e-6f)
            << "rows from " << first_row;
      }
    }
  }
}

// Weights that share their input (Q, K, V) in one op give each the numbers of its own matmul: every output row
// is computed by the same kernel call either way.
TEST(CpuBackendWeights, SharedInputMatmulsEqualSeparateOnes) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  const Case cases[] = {{WeightFormat::q4_1, 96, 576}, {WeightFormat::q8_0, 40, 576}, {WeightFormat::q4_0, 300, 576}};
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<Tensor> weights;
  for (const Case& c : cases) {
    blocks.push_back(random_blocks(c.format, c.rows, c.cols, uint32_t(70 + blocks.size())));
    weights.push_back(be->upload_weight(WeightMatrix{blocks.back().data(), c.format, c.rows, c.cols}));
  }
  for (int64_t t : {int64_t{1}, int64_t{5}, cpu::kDequantizedTileMinRows}) {
    const std::vector<float> x = random_activations(t, 576, 71);
    Tensor tx = be->alloc(t, 576, DType::f32);
    be->copy_from_host(x.data(), tx);
    std::vector<Tensor> together, alone;
    for (const Case& c : cases) {
      together.push_back(be->alloc(t, c.rows, DType::f32));
      alone.push_back(be->alloc(t, c.rows, DType::f32));
    }
    const Tensor* w[] = {&weights[0], &weights[1], &weights[2]};
    Tensor* out[] = {&together[0], &together[1], &together[2]};
    be->matmul_shared_input(tx, w, out);
    for (size_t i = 0; i < 3; ++i) {
      be->matmul(tx, weights[i], alone[i]);
      std::vector<float> a(size_t(together[i].size())), b(a.size());
      be->copy_to_host(together[i], a.data());
      be->copy_to_host(alone[i], b.data());
      EXPECT_EQ(a, b) << "weight " << i << ", " << t << " rows";
    }
  }
}

}  // namespace
}  // namespace strata
