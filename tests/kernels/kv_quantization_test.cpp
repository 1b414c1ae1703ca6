// KIVI quantization of KV blocks (kernels/kv_block_layout.h) through the Backend ops: kv_quantize and
// kv_dequantize against hand-computed groups and against the bound the format implies (|error| <= scale / 2 per
// element, with the scale the test computes itself from the group's min and max), attention over quantized blocks
// against attention over their dequantized copies, and compaction of a layer that holds quantized blocks.
// Quantized blocks are decoded here from the documented byte layout, independently of the CPU primitives.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/kv_block_layout.h"

namespace strata {
namespace {

KvBlockLayout quant_layout(KvQuant quant, int n_kv_heads, int head_dim) {
  KvBlockLayout L;
  L.n_kv_heads = n_kv_heads;
  L.head_dim = head_dim;
  L.block_size = kKvQuantGroup;
  L.quant = quant;
  return L;
}

// A pool of n_slots full-precision blocks; quantized block (slot, sub) has id n_slots + slot * per_slot + sub.
struct QuantPool {
  Backend& be;
  Tensor storage;
  KvPoolView view;
  QuantPool(Backend& backend, KvBlockLayout layout, int n_slots) : be(backend) {
    storage = be.alloc(n_slots, layout.elements_per_block(), DType::f32);
    view = KvPoolView{storage.data, layout, n_slots, {}};
  }
  ~QuantPool() { be.free(storage); }
  int32_t quantized(int slot, int sub) const { return view.n_slots + slot * view.layout.quantized_per_slot() + sub; }
  float* k(int32_t block, int head, int slot) const { return view.block_f32(block) + view.layout.k_offset(head, slot); }
  float* v(int32_t block, int head, int slot) const { return view.block_f32(block) + view.layout.v_offset(head, slot); }
};

// The documented format, decoded directly from the bytes.
int code_of(const uint8_t* row, int c, KvQuant q) {
  const int bits = kv_quant_bits(q), per_byte = 8 / bits;
  return (row[c / per_byte] >> (bits * (c % per_byte))) & ((1 << bits) - 1);
}
// A stored scale or min (fp16), read with the compiler's _Float16 rather than the code under test.
float scale_at(const uint8_t* p) {
  _Float16 x;
  std::memcpy(&x, p, sizeof x);
  return float(x);
}
float key_scale(const KvPoolView& pool, int32_t block, int head, int c) {
  return scale_at(pool.block_quantized(block) + pool.layout.k_scale_offset(head) + kKvScaleBytes * c);
}
float key_min(const KvPoolView& pool, int32_t block, int head, int c) {
  return scale_at(pool.block_quantized(block) + pool.layout.k_min_offset(head) + kKvScaleBytes * c);
}
int key_code(const KvPoolView& pool, int32_t block, int head, int slot, int c) {
  return code_of(pool.block_quantized(block) + pool.layout.k_codes_offset(head, slot), c, pool.layout.quant);
}
double decoded_key(const KvPoolView& pool, int32_t block, int head, int slot, int c) {
  return double(key_min(pool, block, head, c)) + double(key_code(pool, block, head, slot, c)) * key_scale(pool, block, head, c);
}
float value_scale(const KvPoolView& pool, int32_t block, int head, int slot, int g) {
  return scale_at(pool.block_quantized(block) + pool.layout.v_scale_offset(head, slot) + kKvScaleBytes * g);
}
float value_min(const KvPoolView& pool, int32_t block, int head, int slot, int g) {
  return scale_at(pool.block_quantized(block) + pool.layout.v_min_offset(head, slot) + kKvScaleBytes * g);
}
int value_code(const KvPoolView& pool, int32_t block, int head, int slot, int c) {
  return code_of(pool.block_quantized(block) + pool.layout.v_codes_offset(head, slot), c, pool.layout.quant);
}
double decoded_value(const KvPoolView& pool, int32_t block, int head, int slot, int c) {
  const int g = c / kKvQuantGroup;
  return double(value_min(pool, block, head, slot, g)) +
         double(value_code(pool, block, head, slot, c)) * value_scale(pool, block, head, slot, g);
}

// Entry e of a table as doubles, whatever its block's format.
struct Entry {
  std::vector<double> k, v;
};
Entry read_entry(const KvPoolView& pool, const std::vector<int32_t>& table, int e, int head) {
  const int32_t block = table[size_t(e / kKvQuantGroup)];
  const int slot = e % kKvQuantGroup;
  Entry out{std::vector<double>(size_t(pool.layout.head_dim)), std::vector<double>(size_t(pool.layout.head_dim))};
  for (int c = 0; c < pool.layout.head_dim; ++c) {
    if (pool.is_quantized(block)) {
      out.k[size_t(c)] = decoded_key(pool, block, head, slot, c);
      out.v[size_t(c)] = decoded_value(pool, block, head, slot, c);
    } else {
      out.k[size_t(c)] = pool.block_f32(block)[pool.layout.k_offset(head, slot) + c];
      out.v[size_t(c)] = pool.block_f32(block)[pool.layout.v_offset(head, slot) + c];
    }
  }
  return out;
}

void fill_random(const QuantPool& p, int32_t block, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* b = p.view.block_f32(block);
  for (int64_t i = 0; i < p.view.layout.elements_per_block(); ++i) b[i] = dist(rng);
}

// ---------------------------------------------------------------------------------------------------------------
// Formats and hand-computed groups

TEST(KvQuantFormat, BlockSizesAndPacking) {
  // SmolLM2: 3 KV heads of 64. Full precision: 2 x 3 x 32 x 64 x 4 = 49,152 bytes a block.
  const KvBlockLayout i8 = quant_layout(KvQuant::int8, 3, 64), i4 = quant_layout(KvQuant::int4, 3, 64);
  EXPECT_EQ(i8.block_bytes(), 49152);
  // int8: codes 2 x 6,144; key scale and min 2 x 3 x 64 x 2 (fp16); value scale and min 2 x 3 x 32 x 2 x 2.
  EXPECT_EQ(i8.quantized_block_bytes(), 12288 + 768 + 768);
  EXPECT_EQ(i8.quantized_per_slot(), 3);
  EXPECT_EQ(i4.quantized_block_bytes(), 6144 + 768 + 768);
  EXPECT_EQ(i4.quantized_per_slot(), 6);
  // What packed blocks cost the pool: a slot's share, 49,152 / 6 = 8,192 bytes an int4 block, 16,384 an int8 one.
  EXPECT_EQ(i4.packed_pool_bytes(3), 3 * 8192);
  EXPECT_EQ(i8.packed_pool_bytes(3), 3 * 16384);
  EXPECT_EQ(i4.packed_pool_bytes(0), 0);
  // int2: codes 2 x 1,536: 4,608 bytes, 10 a slot (10.67 would fit).
  const KvBlockLayout i2 = quant_layout(KvQuant::int2, 3, 64);
  EXPECT_EQ(i2.quantized_block_bytes(), 3072 + 768 + 768);
  EXPECT_EQ(i2.quantized_per_slot(), 10);
  EXPECT_EQ(quant_layout(KvQuant::none, 3, 64).quantized_per_slot(), 0);
}

TEST(KvQuantize, HandComputedValueGroupInt2PacksFourChannelsAByte) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(KvQuant::int2, 1, 32), 2);
  // Value row of entry 0: min -3, max 6, scale 3 exactly (3 levels); channel c holds -3 + 3 * (c % 4), except
  // channels 8..11, half-way between codes (-1.5, 1.5, 4.5 -> 0.5, 1.5, 2.5 -> 0, 2, 2) and 5.9 (-> 2.97 -> 3).
  std::vector<float> row(32);
  for (int c = 0; c < 32; ++c) row[size_t(c)] = -3.0f + 3.0f * float(c % 4);
  const float odd[] = {-1.5f, 1.5f, 4.5f, 5.9f};
  for (int c = 8; c < 12; ++c) row[size_t(c)] = odd[c - 8];
  std::copy(row.begin(), row.end(), p.v(0, 0, 0));
  const int32_t q = p.quantized(1, 0);
  be->kv_quantize(std::vector<int32_t>{0}, std::vector<int32_t>{q}, p.view);

  EXPECT_EQ(value_scale(p.view, q, 0, 0, 0), 3.0f);
  EXPECT_EQ(value_min(p.view, q, 0, 0, 0), -3.0f);
  for (int c = 0; c < 32; ++c) {
    const int expected = c >= 8 && c < 12 ? std::vector<int>{0, 2, 2, 3}[size_t(c - 8)] : c % 4;
    EXPECT_EQ(value_code(p.view, q, 0, 0, c), expected) << "channel " << c;
  }
  // The packing itself: channels 0..3 (codes 0 1 2 3) are the byte 0b11'10'01'00.
  EXPECT_EQ(p.view.block_quantized(q)[p.view.layout.v_codes_offset(0, 0)], 0xE4);
  be->kv_dequantize(std::vector<int32_t>{q}, std::vector<int32_t>{0}, p.view);
  const float expected[] = {-3, 3, 3, 6};
  for (int c = 8; c < 12; ++c) EXPECT_EQ(p.v(0, 0, 0)[c], expected[c - 8]) << "channel " << c;
  EXPECT_EQ(p.v(0, 0, 0)[13], 0.0f);
}

TEST(KvQuantize, HandComputedValueGroupInt4TiesGoToEven) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(KvQuant::int4, 1, 32), 2);
  // Value row of entry 0: 0, 2, ..., 30 (min 0, max 30, scale 2 exactly), then values half-way between codes.
  std::vector<float> row(32);
  for (int c = 0; c < 16; ++c) row[size_t(c)] = 2.0f * c;
  const float halves[] = {1, 3, 5, 29};  // codes 0.5, 1.5, 2.5, 14.5 -> 0, 2, 2, 14 (round half to even)
  for (int c = 16; c < 20; ++c) row[size_t(c)] = halves[c - 16];
  for (int c = 20; c < 32; ++c) row[size_t(c)] = 7.0f;  // 3.5 -> 4
  std::copy(row.begin(), row.end(), p.v(0, 0, 0));
  const int32_t q = p.quantized(1, 0);
  be->kv_quantize(std::vector<int32_t>{0}, std::vector<int32_t>{q}, p.view);

  EXPECT_EQ(value_scale(p.view, q, 0, 0, 0), 2.0f);
  EXPECT_EQ(value_min(p.view, q, 0, 0, 0), 0.0f);
  const int expected_codes[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 2, 2, 14,
                                4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
  for (int c = 0; c < 32; ++c) EXPECT_EQ(value_code(p.view, q, 0, 0, c), expected_codes[c]) << "channel " << c;
  // Back through kv_dequantize: exact on the grid, scale / 2 = 1 off at the ties.
  be->kv_dequantize(std::vector<int32_t>{q}, std::vector<int32_t>{0}, p.view);
  const float expected[] = {0, 4, 4, 28, 8};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(p.v(0, 0, 0)[c], 2.0f * c);
  for (int c = 16; c < 21; ++c) EXPECT_EQ(p.v(0, 0, 0)[c], expected[c - 16]) << "channel " << c;
}

TEST(KvQuantize, HandComputedKeyChannelsInt8) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(KvQuant::int8, 1, 32), 2);
  for (int t = 0; t < 32; ++t) {
    float* k = p.k(0, 0, t);
    k[0] = float(t);                      // 0 .. 31: scale 31 / 255
    k[1] = 5.0f;                          // constant: scale 0, every code 0, exact
    k[2] = t == 31 ? 10000.0f : -1.0f;    // one outlier: the others sit on code 0, exactly
  }
  const int32_t q = p.quantized(1, 0);
  be->kv_quantize(std::vector<int32_t>{0}, std::vector<int32_t>{q}, p.view);

  // Scales are stored in fp16: 31 / 255 = 0.1215686... becomes 0.12158203125 (1992 * 2^-14).
  const float scale0 = float(_Float16(31.0f / 255.0f));
  ASSERT_EQ(scale0, 1992.0f / 16384.0f);
  EXPECT_EQ(key_scale(p.view, q, 0, 0), scale0);
  EXPECT_EQ(key_min(p.view, q, 0, 0), 0.0f);
  // t / scale0: 1 -> 8.22 -> 8, 2 -> 16.45 -> 16, 3 -> 24.67 -> 25, 16 -> 131.6 -> 132, 31 -> 254.97 -> 255.
  EXPECT_EQ(key_code(p.view, q, 0, 1, 0), 8);
  EXPECT_EQ(key_code(p.view, q, 0, 2, 0), 16);
  EXPECT_EQ(key_code(p.view, q, 0, 3, 0), 25);
  EXPECT_EQ(key_code(p.view, q, 0, 16, 0), 132);
  EXPECT_EQ(key_code(p.view, q, 0, 31, 0), 255);
  EXPECT_EQ(key_scale(p.view, q, 0, 1), 0.0f);
  EXPECT_EQ(key_min(p.view, q, 0, 1), 5.0f);
  EXPECT_EQ(key_code(p.view, q, 0, 7, 2), 0);
  EXPECT_EQ(key_code(p.view, q, 0, 31, 2), 255);

  be->kv_dequantize(std::vector<int32_t>{q}, std::vector<int32_t>{0}, p.view);
  EXPECT_EQ(p.k(0, 0, 3)[0], 25.0f * scale0);  // 3.0396
  EXPECT_EQ(p.k(0, 0, 16)[0], 132.0f * scale0);
  for (int t = 0; t < 32; ++t) EXPECT_EQ(p.k(0, 0, t)[1], 5.0f);
  for (int t = 0; t < 31; ++t) EXPECT_EQ(p.k(0, 0, t)[2], -1.0f);
  // The outlier's scale, 10001 / 255 = 39.22, is stored as 39.21875 (fp16 keeps 2^-5 there): 9,999.78 comes back.
  const float scale2 = float(_Float16(10001.0f / 255.0f));
  ASSERT_EQ(scale2, 39.21875f);
  EXPECT_EQ(p.k(0, 0, 31)[2], -1.0f + 255.0f * scale2);
}

// ---------------------------------------------------------------------------------------------------------------
// Round trip within the bound: every element within half its group's scale (min and max computed here)

// How far a value of a group spanning [lo, hi] may come back from where it was: half a code step, plus fp16's
// rounding of the stored min and scale (kernels/kv_block_layout.h): half an ulp, at most 2^-11 of the value (2^-25
// absolute below fp16's smallest normal), the scale's times up to `levels` codes.
double quantization_bound(double lo, double hi, int levels) {
  return (hi - lo) / levels / 2 + 0x1p-11 * (std::fabs(lo) + (hi - lo)) + (levels + 1) * 0x1p-25;
}

// Largest |x - x'| / (scale / 2) over every group of a block, with float rounding allowed for.
double worst_bound_ratio(const QuantPool& p, const std::vector<float>& original, int32_t restored) {
  const KvBlockLayout& L = p.view.layout;
  const int levels = (1 << kv_quant_bits(L.quant)) - 1;
  double worst = 0.0;
  auto check = [&](double x, double y, double lo, double hi) {
    const double half_scale = (hi - lo) / levels / 2.0;
    // fp16's rounding of the stored pair, then the float arithmetic of min + code * scale.
    const double slack =
        quantization_bound(lo, hi, levels) - half_scale + 4e-7 * std::max(std::fabs(lo), std::fabs(hi));
    const double err = std::fabs(x - y);
    if (err > slack) worst = std::max(worst, half_scale > 0 ? (err - slack) / half_scale : INFINITY);
  };
  const float* out = p.view.block_f32(restored);
  for (int h = 0; h < L.n_kv_heads; ++h) {
    for (int c = 0; c < L.head_dim; ++c) {  // keys: per channel over the 32 entries
      double lo = INFINITY, hi = -INFINITY;
      for (int t = 0; t < 32; ++t) {
        lo = std::min(lo, double(original[size_t(L.k_offset(h, t) + c)]));
        hi = std::max(hi, double(original[size_t(L.k_offset(h, t) + c)]));
      }
      for (int t = 0; t < 32; ++t) check(original[size_t(L.k_offset(h, t) + c)], out[L.k_offset(h, t) + c], lo, hi);
    }
    for (int t = 0; t < 32; ++t) {  // values: per entry over 32 channels
      for (int g = 0; g < L.head_dim / 32; ++g) {
        const float* x = original.data() + L.v_offset(h, t) + g * 32;
        const double lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
        for (int c = 0; c < 32; ++c) check(x[c], out[L.v_offset(h, t) + g * 32 + c], lo, hi);
      }
    }
  }
  return worst;
}

class KvQuantRoundTrip : public ::testing::TestWithParam<KvQuant> {};

TEST_P(KvQuantRoundTrip, RandomAndAdversarialGroupsStayWithinHalfAScale) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(GetParam(), 3, 64), 12);
  const KvBlockLayout& L = p.view.layout;
  const int n = 5;  // source blocks 0..4, quantized blocks in slots 5..6, restored into slots 7..11
  fill_random(p, 0, 1);
  fill_random(p, 1, 2, -1e-3f, 1e-3f);  // tiny values
  fill_random(p, 2, 3, 100.0f, 300.0f);  // far from zero
  fill_random(p, 3, 4);
  fill_random(p, 4, 5);
  float* b3 = p.view.block_f32(3);  // outliers: one huge key per channel of head 0, one huge value per row
  for (int c = 0; c < L.head_dim; ++c) b3[L.k_offset(0, c % 32) + c] = 500.0f;
  for (int t = 0; t < 32; ++t) b3[L.v_offset(1, t) + t] = -800.0f;
  float* b4 = p.view.block_f32(4);  // constant groups: a constant key channel and constant value rows
  for (int t = 0; t < 32; ++t) b4[L.k_offset(2, t) + 5] = 0.25f;
  for (int c = 0; c < L.head_dim; ++c) b4[L.v_offset(0, 9) + c] = -3.0f;

  std::vector<std::vector<float>> originals;
  for (int b = 0; b < n; ++b) originals.emplace_back(p.view.block_f32(b), p.view.block_f32(b) + L.elements_per_block());
  std::vector<int32_t> src, quantized, restored;
  for (int b = 0; b < n; ++b) {
    src.push_back(b);
    quantized.push_back(p.quantized(5 + b / L.quantized_per_slot(), b % L.quantized_per_slot()));
    restored.push_back(7 + b);
  }
  be->kv_quantize(src, quantized, p.view);
  be->kv_dequantize(quantized, restored, p.view);
  for (int b = 0; b < n; ++b) {
    EXPECT_LE(worst_bound_ratio(p, originals[size_t(b)], restored[size_t(b)]), 1.0) << "block " << b;
  }
  // The constant groups come back exactly.
  for (int t = 0; t < 32; ++t) EXPECT_EQ(p.view.block_f32(11)[L.k_offset(2, t) + 5], 0.25f);
  for (int c = 0; c < L.head_dim; ++c) EXPECT_EQ(p.view.block_f32(11)[L.v_offset(0, 9) + c], -3.0f);
  // Quantizing the restored values again changes nothing: they are on their own grid already (values exactly:
  // min and max are restored exactly; keys within float rounding).
  be->kv_quantize(restored, quantized, p.view);
  std::vector<float> again(p.view.block_f32(7), p.view.block_f32(7) + L.elements_per_block());
  be->kv_dequantize(quantized, restored, p.view);
  for (int64_t i = 0; i < L.elements_per_block(); ++i) ASSERT_NEAR(p.view.block_f32(7)[i], again[size_t(i)], 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Formats, KvQuantRoundTrip, ::testing::Values(KvQuant::int8, KvQuant::int4, KvQuant::int2),
                         [](const auto& info) { return std::string(kv_quant_name(info.param)); });

// kv_dequantize writes min + code * scale in float arithmetic, which is exact up to the one rounding of the sum:
// the same float as this test's decode of the bytes, on every instruction-set level the machine has (the portable
// bodies and AVX2's, kernels/cpu/kv_dequantize_avx2.cpp; attention reads quantized blocks through them). head_dim
// 96: three groups of 32 channels, so three value groups.
TEST_P(KvQuantRoundTrip, DequantizedBlocksAreTheDocumentedDecodeOfTheirBytesAtEveryLevel) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(GetParam(), 2, 96), 9);
  const KvBlockLayout& L = p.view.layout;
  for (int b = 0; b < 3; ++b) fill_random(p, b, 20 + uint32_t(b), -4.0f, 3.0f);
  std::vector<int32_t> quantized;
  for (int b = 0; b < 3; ++b) {
    quantized.push_back(p.quantized(3 + b / L.quantized_per_slot(), b % L.quantized_per_slot()));
  }
  be->kv_quantize(std::vector<int32_t>{0, 1, 2}, quantized, p.view);
  const cpu::CpuIsa best = cpu::best_cpu_isa();
  for (const cpu::CpuIsa level : {cpu::CpuIsa::baseline, cpu::CpuIsa::avx2}) {
    if (!cpu::cpu_supports(level)) continue;
    cpu::limit_cpu_isa(level);
    be->kv_dequantize(quantized, std::vector<int32_t>{6, 7, 8}, p.view);
    cpu::limit_cpu_isa(best);
    for (int b = 0; b < 3; ++b) {
      for (int h = 0; h < L.n_kv_heads; ++h) {
        for (int t = 0; t < L.block_size; ++t) {
          for (int c = 0; c < L.head_dim; ++c) {
            ASSERT_EQ(p.k(6 + b, h, t)[c], float(decoded_key(p.view, quantized[size_t(b)], h, t, c)))
                << cpu::cpu_isa_name(level) << ": block " << b << " head " << h << " entry " << t << " key channel "
                << c;
            ASSERT_EQ(p.v(6 + b, h, t)[c], float(decoded_value(p.view, quantized[size_t(b)], h, t, c)))
                << cpu::cpu_isa_name(level) << ": block " << b << " head " << h << " entry " << t
                << " value channel " << c;
          }
        }
      }
    }
  }
}

TEST(KvQuantize, RejectsPairsThatDoNotGoBetweenTheFormats) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(KvQuant::int4, 1, 32), 3);
  const int32_t q = p.quantized(2, 0);
  EXPECT_THROW(be->kv_quantize(std::vector<int32_t>{0}, std::vector<int32_t>{1}, p.view), std::invalid_argument);
  EXPECT_THROW(be->kv_quantize(std::vector<int32_t>{q}, std::vector<int32_t>{0}, p.view), std::invalid_argument);
  EXPECT_THROW(be->kv_dequantize(std::vector<int32_t>{0}, std::vector<int32_t>{1}, p.view), std::invalid_argument);
  EXPECT_THROW(be->kv_quantize(std::vector<int32_t>{0, 1}, std::vector<int32_t>{q}, p.view), std::invalid_argument);
  QuantPool f32(*be, quant_layout(KvQuant::none, 1, 32), 3);
  EXPECT_THROW(be->kv_quantize(std::vector<int32_t>{0}, std::vector<int32_t>{1}, f32.view), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------------------
// Attention over quantized blocks against attention over their dequantized copies

TEST(KvQuantAttention, QuantizedBlocksReadAsTheirDequantizedValues) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4, KvQuant::int2}) {
    auto be = make_cpu_backend();
    const int n_heads = 6, hd = 64;
    QuantPool p(*be, quant_layout(quant, 2, hd), 16);
    // Sequence 0: 83 entries, 3 of them new (prefill rows): 2 quantized groups, then a full-precision block.
    // Sequence 1: one decode row over 40 entries: 1 quantized group, then a full-precision block.
    for (int b = 0; b < 5; ++b) fill_random(p, b, 10 + uint32_t(b));
    const std::vector<int32_t> q_ids = {p.quantized(14, 0), p.quantized(14, 1), p.quantized(15, 0)};
    be->kv_quantize(std::vector<int32_t>{0, 1, 3}, q_ids, p.view);
    const std::vector<int32_t> table0 = {q_ids[0], q_ids[1], 2}, table1 = {q_ids[2], 4};
    be->kv_dequantize(q_ids, std::vector<int32_t>{5, 6, 7}, p.view);
    const std::vector<int32_t> ref0 = {5, 6, 2}, ref1 = {7, 4};

    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    Tensor q = be->alloc(4, int64_t(n_heads) * hd, DType::f32);
    for (int64_t i = 0; i < q.size(); ++i) q.f32()[i] = 3.0f * dist(rng);
    Tensor out = be->alloc(4, q.cols, DType::f32), out_ref = be->alloc(4, q.cols, DType::f32);
    const int stride = 83;
    std::vector<float> sums(size_t(n_heads) * stride, 0.0f), sums_ref(sums.size(), 0.0f);
    auto run = [&](const std::vector<int32_t>& t0, const std::vector<int32_t>& t1, Tensor& o, std::vector<float>& s) {
      std::vector<AttentionSequence> seqs = {{1, 3, 80, t0, s.data(), stride, 0}, {0, 1, 39, t1}};
      be->paged_attention(q, seqs, p.view, n_heads, 0.125f, o);
    };
    run(table0, table1, out, sums);
    run(ref0, ref1, out_ref, sums_ref);
    for (int64_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out.f32()[i], out_ref.f32()[i], 2e-5) << "element " << i;
    for (size_t i = 0; i < sums.size(); ++i) ASSERT_NEAR(sums[i], sums_ref[i], 2e-6) << "column sum " << i;
  }
}

TEST(KvQuantAttention, NewEntriesNeverGoToQuantizedBlocks) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(KvQuant::int8, 1, 32), 4);
  Tensor k = be->alloc(1, 32, DType::f32), v = be->alloc(1, 32, DType::f32);
  const std::vector<int32_t> table = {p.quantized(3, 0), 1};
  std::vector<AttentionSequence> into_quantized = {{0, 1, 31, table}}, into_staging = {{0, 1, 32, table}};
  EXPECT_THROW(be->kv_write(k, v, into_quantized, p.view), std::logic_error);
  EXPECT_NO_THROW(be->kv_write(k, v, into_staging, p.view));
}

// ---------------------------------------------------------------------------------------------------------------
// Compaction of a layer with quantized blocks

struct QuantLayer {
  std::vector<int32_t> table;
  std::vector<std::vector<Entry>> before;  // [head][entry] as the layer held them (quantized ones decoded)
  int n_entries;
};

// 3 quantized groups and 40 full-precision entries in 2 blocks, 2 KV heads of 64 channels.
QuantLayer make_quant_layer(Backend& be, QuantPool& p) {
  for (int b = 0; b < 5; ++b) fill_random(p, b, 100 + uint32_t(b));
  const std::vector<int32_t> q = {p.quantized(10, 0), p.quantized(10, 1), p.quantized(11, 0)};
  be.kv_quantize(std::vector<int32_t>{0, 1, 2}, q, p.view);
  QuantLayer layer{{q[0], q[1], q[2], 3, 4}, {}, 96 + 40};
  for (int h = 0; h < p.view.layout.n_kv_heads; ++h) {
    layer.before.emplace_back();
    for (int e = 0; e < layer.n_entries; ++e) layer.before.back().push_back(read_entry(p.view, layer.table, e, h));
  }
  return layer;
}

// After compaction with kept (for one head): values are exactly what they were wherever they were quantized or
// stay full precision (a full-precision value in a quantized group is within half its scale); keys are exact
// in untouched groups and full-precision entries, and within half the new per-channel scale in rebuilt groups.
void check_compacted(const QuantPool& p, const QuantLayer& layer, const std::vector<int32_t>& table_after,
                     const std::vector<int32_t>& kept, int head) {
  const KvBlockLayout& L = p.view.layout;
  const int levels = (1 << kv_quant_bits(L.quant)) - 1;
  const int n_kept = int(kept.size());
  for (int j = 0; j < n_kept; ++j) {
    const Entry now = read_entry(p.view, table_after, j, head);
    const Entry& was = layer.before[size_t(head)][size_t(kept[size_t(j)])];
    const bool now_quantized = p.view.is_quantized(table_after[size_t(j / 32)]);
    const bool was_quantized = kept[size_t(j)] < 96;
    for (int c = 0; c < L.head_dim; ++c) {
      if (!now_quantized || was_quantized) {
        ASSERT_NEAR(now.v[size_t(c)], was.v[size_t(c)], 1e-6) << "value of entry " << j << " channel " << c;
      } else {
        const int g = c / 32;
        double lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < 32; ++i) {
          lo = std::min(lo, was.v[size_t(g * 32 + i)]);
          hi = std::max(hi, was.v[size_t(g * 32 + i)]);
        }
        ASSERT_LE(std::fabs(now.v[size_t(c)] - was.v[size_t(c)]), quantization_bound(lo, hi, levels) + 1e-6)
            << "entry " << j;
      }
    }
    if (!now_quantized) {
      for (int c = 0; c < L.head_dim; ++c) ASSERT_NEAR(now.k[size_t(c)], was.k[size_t(c)], 1e-6) << "key " << j;
    }
  }
  for (int group = 0; group * 32 < n_kept && p.view.is_quantized(table_after[size_t(group)]); ++group) {
    for (int c = 0; c < L.head_dim; ++c) {
      double lo = INFINITY, hi = -INFINITY;
      for (int t = 0; t < 32; ++t) {
        const double x = layer.before[size_t(head)][size_t(kept[size_t(group * 32 + t)])].k[size_t(c)];
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      for (int t = 0; t < 32; ++t) {
        const double x = layer.before[size_t(head)][size_t(kept[size_t(group * 32 + t)])].k[size_t(c)];
        ASSERT_LE(std::fabs(decoded_key(p.view, table_after[size_t(group)], head, t, c) - x),
                  quantization_bound(lo, hi, levels) + 1e-5)
            << "key of entry " << group * 32 + t << " channel " << c;
      }
    }
  }
}

// Compacts the test layer, in every format, to the entries `evicted` rejects; quantized group `from` must then be
// in group `to`'s block byte for byte, and every kept entry within check_compacted's bounds.
template <class Evicted>
void expect_group_intact_after_compaction(Evicted evicted, int from, int to) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4, KvQuant::int2}) {
    SCOPED_TRACE(kv_quant_name(quant));
    auto be = make_cpu_backend();
    QuantPool p(*be, quant_layout(quant, 2, 64), 12);
    const QuantLayer layer = make_quant_layer(*be, p);
    std::vector<int32_t> kept;
    for (int e = 0; e < layer.n_entries; ++e) {
      if (!evicted(e)) kept.push_back(e);
    }
    const uint8_t* before = p.view.block_quantized(layer.table[size_t(from)]);
    const std::vector<uint8_t> group_before(before, before + p.view.layout.quantized_block_bytes());
    be->kv_compact(layer.table, kept, p.view, -1);
    const uint8_t* after = p.view.block_quantized(layer.table[size_t(to)]);
    size_t differing = 0;
    for (size_t i = 0; i < group_before.size(); ++i) differing += after[i] != group_before[i];
    EXPECT_EQ(differing, 0u) << "bytes of group " << from << " that changed";
    for (int h = 0; h < 2; ++h) check_compacted(p, layer, layer.table, kept, h);
  }
}

TEST(KvQuantCompaction, EvictingInsideAGroupRebuildsOnlyTheGroupsFromThere) {
  // Drop entry 40 (group 1) and entries 100 and 101 (full precision): 133 kept, still 3 quantized groups, entries
  // 96 and 97 move from the full-precision region into group 2, and group 0 stays untouched.
  expect_group_intact_after_compaction([](int e) { return e == 40 || e == 100 || e == 101; }, 0, 0);
}

TEST(KvQuantCompaction, EvictingAWholeGroupMovesTheGroupsAfterItIntact) {
  // What decode-time eviction on a quantized pool relies on (PolicyContext::decode_eviction_batch): group 2 moves
  // into group 1's block whole, and its rebuilt keys come back with the same codes, scales and mins, because a
  // group's min and top code are on its own grid.
  expect_group_intact_after_compaction([](int e) { return e >= 32 && e < 64; }, 2, 1);
}

TEST(KvQuantCompaction, PerHeadSelectionsThatGiveUpQuantizedGroups) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(KvQuant::int4, 2, 64), 12);
  const QuantLayer layer = make_quant_layer(*be, p);
  // 50 entries per head: one quantized group remains (the first), 18 entries go to the first full-precision block.
  std::vector<std::vector<int32_t>> kept(2);
  for (int e = 0; e < 50; ++e) kept[0].push_back(e * 2 + 1);  // every other: across all groups and beyond
  for (int e = 0; e < 25; ++e) kept[1].push_back(e);           // the first 25 ...
  for (int e = 0; e < 25; ++e) kept[1].push_back(96 + e);      // ... and 25 full-precision ones
  ASSERT_EQ(compacted_quantized_blocks(3, 50), 1);
  for (int h = 0; h < 2; ++h) be->kv_compact(layer.table, kept[size_t(h)], p.view, h);
  const std::vector<int32_t> after = {layer.table[0], layer.table[3]};  // KvCache then drops blocks 1, 2 and 4
  for (int h = 0; h < 2; ++h) check_compacted(p, layer, after, kept[size_t(h)], h);
}

TEST(KvQuantCompaction, RejectsTablesItCannotCompact) {
  auto be = make_cpu_backend();
  QuantPool p(*be, quant_layout(KvQuant::int8, 1, 32), 6);
  const int32_t q0 = p.quantized(5, 0), q1 = p.quantized(5, 1);
  std::vector<int32_t> kept(33);
  for (int i = 0; i < 33; ++i) kept[size_t(i)] = i;
  // A quantized block after a full-precision one.
  EXPECT_THROW(be->kv_compact(std::vector<int32_t>{q0, 0, q1}, kept, p.view, -1), std::invalid_argument);
  // Two groups given up to a remainder of 10 entries, with no full-precision block to hold it.
  EXPECT_THROW(be->kv_compact(std::vector<int32_t>{q0, q1}, std::vector<int32_t>(kept.begin(), kept.begin() + 10),
                              p.view, -1),
               std::invalid_argument);
}

}  // namespace
}  // namespace strata
