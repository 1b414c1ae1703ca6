// Every CPU KV op on a 16-bit pool (kv_cache.dtype f16 | bf16) against the same op on an fp32 pool that holds the
// same values, which is what kernels/cpu/kv_rows.h promises: a 16-bit element widens exactly, so whatever an op
// computes from the cache is the same bits on both pools, and what it writes the 16-bit pool holds as the fp32
// pool's value rounded to nearest even (tests/kernels/half_reference.h, written apart from the library's
// rounding). Attention on 16-bit pools is also checked against the double reference
// (tests/kernels/paged_attention_test.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_codebook.h"
#include "kernels/pod_attention.h"
#include "tests/kernels/half_reference.h"

namespace strata {
namespace {

constexpr int kKvHeads = 2, kHeads = 4, kHeadDim = 32, kPositions = 256;
// Slots [0, kFull) hold full-precision blocks, then kPacked slots coded or quantized blocks, then codebook vectors.
constexpr int kFull = 12, kPacked = 2, kVectorSlots = 2, kSlots = kFull + kPacked + kVectorSlots;

struct Pool {
  KvBlockLayout layout;
  std::vector<float> memory;  // as many floats as the slots' bytes need
  KvPoolView view;

  Pool(const KvBlockLayout& l, const KvKeyRope& rope)
      : layout(l), memory(size_t(kSlots * l.block_bytes() / 4)), view{memory.data(), l, kSlots, rope} {}
  int64_t full_elements() const { return kFull * layout.elements_per_block(); }
  float element(int64_t i) const {
    if (layout.dtype == DType::f32) return memory[size_t(i)];
    uint16_t bits;
    std::memcpy(&bits, reinterpret_cast<const uint8_t*>(memory.data()) + 2 * i, sizeof bits);
    return test::widen_half(bits, layout.dtype);
  }
  void set(int64_t i, float x) {
    if (layout.dtype == DType::f32) {
      memory[size_t(i)] = x;
    } else {
      const uint16_t bits = test::round_to_half(x, layout.dtype);
      std::memcpy(reinterpret_cast<uint8_t*>(memory.data()) + 2 * i, &bits, sizeof bits);
    }
  }
  // Packed (coded or quantized) block k, stored in slot kFull + k / packed_per_slot().
  int32_t packed_id(int k) const { return kSlots + kFull * layout.packed_per_slot() + k; }
  int32_t vector_id(int i) const { return int32_t((kFull + kPacked) * layout.vectors_per_slot() + i); }
};

// An fp32 pool and a 16-bit one whose full-precision slots hold the same random values.
struct Twins {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  DType dtype;
  std::vector<float> rope_table = std::vector<float>(size_t(kPositions) * kHeadDim);
  Pool wide, half;
  std::mt19937 rng;

  Twins(DType half_dtype, KvQuant quant, uint32_t seed)
      : dtype(half_dtype),
        wide(layout(DType::f32, quant), rope()),
        half(layout(half_dtype, quant), rope()),
        rng(seed) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < wide.full_elements(); ++i) {
      const float x = rounded(normal(rng));
      wide.set(i, x);
      half.set(i, x);
    }
  }
  static KvBlockLayout layout(DType dtype, KvQuant quant) {
    return KvBlockLayout{kKvHeads, kHeadDim, quant == KvQuant::none ? 8 : kKvQuantGroup, dtype, quant};
  }
  KvKeyRope rope() {
    key_rope_table(kHeadDim, RopeParams{}, kPositions, rope_table.data());
    return KvKeyRope{rope_table.data(), kPositions, RopeStyle::half_split};
  }
  float rounded(float x) const { return test::widen_half(test::round_to_half(x, dtype), dtype); }
  std::vector<float> random(size_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  }
  // The fp32 pool's elements rounded as the 16-bit pool's are, so that the two hold the same values again.
  void round_wide() {
    for (int64_t i = 0; i < wide.full_elements(); ++i) wide.set(i, rounded(wide.element(i)));
  }
  // Every full-precision element: the 16-bit pool's is the fp32 pool's, rounded.
  void expect_rows_match(const std::string& what) const {
    for (int64_t i = 0; i < wide.full_elements(); ++i) {
      ASSERT_EQ(half.element(i), rounded(wide.element(i))) << what << ", " << dtype_name(dtype) << ": element " << i;
    }
  }
};

// Both pools, one after the other: op(pool, 0) on the fp32 one, op(pool, 1) on the 16-bit one.
template <class Op>
void on_both(Twins& t, Op op) {
  op(t.wide, 0);
  op(t.half, 1);
}

const std::vector<int32_t> kTableA = {3, 0, 7, 5}, kTableB = {1, 9, 2, 11};

TEST(HalfKvPool, WritesRoundAndAttentionReadsTheSameValues) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Twins t(dtype, KvQuant::none, 1);
    // A prefill chunk of 10 rows after 20 entries (transposed keys: 10 rows x 2 heads a KV head), a decode row.
    std::vector<AttentionSequence> seqs = {{0, 10, 20, kTableA}, {10, 1, 17, kTableB}};
    const int rows = 11;
    const std::vector<float> k = t.random(size_t(rows * kKvHeads * kHeadDim)), v = t.random(k.size());
    on_both(t, [&](Pool& p, int) {
      t.cpu->kv_write(Tensor{const_cast<float*>(k.data()), DType::f32, rows, kKvHeads * kHeadDim},
                      Tensor{const_cast<float*>(v.data()), DType::f32, rows, kKvHeads * kHeadDim}, seqs, p.view);
    });
    t.expect_rows_match("kv_write");
    t.round_wide();

    const std::vector<float> q = t.random(size_t(rows * kHeads * kHeadDim));
    std::vector<float> out[2], sums[2];
    on_both(t, [&](Pool& p, int i) {
      out[i].assign(q.size(), 0.0f);
      sums[i].assign(size_t(kHeads * 32), 0.0f);
      seqs[0].column_sums = sums[i].data();
      seqs[0].sums_stride = 32;
      seqs[0].stats_row_begin = 4;
      Tensor o{out[i].data(), DType::f32, rows, kHeads * kHeadDim};
      t.cpu->paged_attention(Tensor{const_cast<float*>(q.data()), DType::f32, rows, kHeads * kHeadDim}, seqs, p.view,
                             kHeads, 0.17f, o);
    });
    EXPECT_EQ(out[0], out[1]) << dtype_name(dtype);
    EXPECT_EQ(sums[0], sums[1]) << dtype_name(dtype);
  }
}

TEST(HalfKvPool, CompactionMovesTheSameValues) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Twins t(dtype, KvQuant::none, 2);
    std::vector<int32_t> kept;
    for (int e = 0; e < 30; ++e) {
      if (e % 3 != 1) kept.push_back(e);
    }
    on_both(t, [&](Pool& p, int) { t.cpu->kv_compact(kTableA, kept, p.view, 1); });
    t.expect_rows_match("kv_compact, one head");
    kept.resize(12);
    on_both(t, [&](Pool& p, int) { t.cpu->kv_compact(kTableB, kept, p.view, -1); });
    t.expect_rows_match("kv_compact, every head");
  }
}

TEST(HalfKvPool, MergesReadAndWriteTheSameValues) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Twins t(dtype, KvQuant::none, 3);
    const std::vector<int32_t> queries = {1, 4, 8, 30}, candidates = {0, 2, 3, 5, 17};
    std::vector<float> similarity[2] = {std::vector<float>(4), std::vector<float>(4)};
    std::vector<int32_t> nearest[2] = {std::vector<int32_t>(4), std::vector<int32_t>(4)};
    on_both(t, [&](Pool& p, int i) {
      t.cpu->kv_nearest_keys(kTableA, 1, queries, candidates, p.view, similarity[i], nearest[i]);
    });
    EXPECT_EQ(similarity[0], similarity[1]) << dtype_name(dtype);
    EXPECT_EQ(nearest[0], nearest[1]) << dtype_name(dtype);
    KvMerges merges;
    merges.add(2, 0.5f, {1, 4}, {0.3f, 0.2f});
    merges.add(17, 0.7f, {30}, {0.3f});
    on_both(t, [&](Pool& p, int) { t.cpu->kv_merge(kTableA, merges, p.view, 0); });
    t.expect_rows_match("kv_merge");
  }
}

TEST(HalfKvPool, KeyFormsReadTheSameValues) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Twins t(dtype, KvQuant::none, 4);
    const std::vector<float> linear = t.random(2 * kHeadDim), quadratic = t.random(2 * kHeadDim * kHeadDim);
    std::vector<float> forms[2], norms[2];
    on_both(t, [&](Pool& p, int i) {
      forms[i].assign(2 * 29, 0.0f);
      norms[i].assign(29, 0.0f);
      t.cpu->kv_key_forms(kTableB, 1, linear, quadratic, p.view, forms[i], norms[i]);
    });
    EXPECT_EQ(forms[0], forms[1]) << dtype_name(dtype);
    EXPECT_EQ(norms[0], norms[1]) << dtype_name(dtype);
  }
}

TEST(HalfKvPool, CodebookOpsReadAndWriteTheSameValues) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Twins t(dtype, KvQuant::none, 5);
    std::vector<int32_t> positions(16);
    for (int e = 0; e < 16; ++e) positions[size_t(e)] = 3 * e;
    for (KvPart part : {KvPart::key, KvPart::value}) {
      std::vector<int32_t> assignment[2], centres[2];
      int codes[2];
      on_both(t, [&](Pool& p, int i) {
        assignment[i].assign(16, 0);
        centres[i].assign(16, 0);
        codes[i] = t.cpu->kv_codebook_build(kTableA, 1, part, positions, 0.2f, p.view, assignment[i], centres[i]);
      });
      EXPECT_EQ(codes[0], codes[1]) << dtype_name(dtype);
      EXPECT_EQ(assignment[0], assignment[1]) << dtype_name(dtype);
      EXPECT_EQ(centres[0], centres[1]) << dtype_name(dtype);
    }
    // Four codebook vectors (fp32 in both pools), matched against entries 16-23, which are then coded.
    const std::vector<float> vectors = t.random(4 * kHeadDim);
    std::vector<int32_t> codebook[2];
    on_both(t, [&](Pool& p, int i) {
      std::vector<int32_t>& ids = codebook[i];
      for (int c = 0; c < 4; ++c) {
        std::memcpy(p.view.codebook_vector(p.vector_id(c)), vectors.data() + c * kHeadDim, sizeof(float) * kHeadDim);
        ids.push_back(p.vector_id(c));
      }
    });
    const std::vector<int32_t> entries = {16, 17, 18, 19, 20, 21, 22, 23};
    const std::vector<int32_t> entry_positions = {40, 41, 42, 43, 44, 45, 46, 47};
    std::vector<float> best[2] = {std::vector<float>(8), std::vector<float>(8)};
    std::vector<int32_t> index[2] = {std::vector<int32_t>(8), std::vector<int32_t>(8)};
    on_both(t, [&](Pool& p, int i) {
      t.cpu->kv_codebook_match(kTableA, 0, KvPart::key, entries, entry_positions, codebook[i], p.view, best[i],
                               index[i]);
    });
    EXPECT_EQ(best[0], best[1]) << dtype_name(dtype);
    EXPECT_EQ(index[0], index[1]) << dtype_name(dtype);

    KvCodeRow coded[2][8];
    std::vector<float> new_vector[2];
    on_both(t, [&](Pool& p, int i) {
      KvCodebookEncoding e;
      e.entry_begin = 16;
      e.positions = entry_positions;
      for (int j = 0; j < 8; ++j) {
        e.k_vectors.push_back(codebook[i][size_t(index[i][size_t(j)])]);
        e.v_vectors.push_back(codebook[i][size_t(j % 4)]);
      }
      e.new_k_entries = {18};
      e.new_k_vectors = {p.vector_id(4)};
      e.coded_blocks = {p.packed_id(0)};
      e.write_back_from = 20;
      t.cpu->kv_codebook_encode(kTableA, e, p.view);
      const KvCodeRow* rows = p.view.block_coded(p.packed_id(0));
      for (int j = 0; j < 8; ++j) coded[i][j] = rows[p.layout.code_row_index(0, j)];
      const float* v = p.view.codebook_vector(p.vector_id(4));
      new_vector[i].assign(v, v + kHeadDim);
    });
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(coded[0][j].k_magnitude, coded[1][j].k_magnitude) << dtype_name(dtype) << " entry " << j;
      EXPECT_EQ(coded[0][j].v_magnitude, coded[1][j].v_magnitude) << dtype_name(dtype) << " entry " << j;
      EXPECT_EQ(coded[0][j].position, coded[1][j].position);
    }
    EXPECT_EQ(new_vector[0], new_vector[1]) << dtype_name(dtype);
    t.expect_rows_match("kv_codebook_encode's write-back");
  }
}

TEST(HalfKvPool, PodReadsTheSameValues) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Twins t(dtype, KvQuant::none, 6);
    const std::vector<AttentionSequence> seqs = {{0, 3, 20, kTableA}};
    const std::vector<float> q = t.random(3 * kHeads * kHeadDim), q_distant = t.random(q.size());
    const std::vector<PodDistant> distant = {
        PodDistant{{kTableB, kTableB}, {q_distant.data(), q_distant.data()}}};
    std::vector<float> out[2];
    on_both(t, [&](Pool& p, int i) {
      out[i].assign(q.size(), 0.0f);
      Tensor o{out[i].data(), DType::f32, 3, kHeads * kHeadDim};
      t.cpu->pod_attention(Tensor{const_cast<float*>(q.data()), DType::f32, 3, kHeads * kHeadDim}, seqs, distant,
                           p.view, kHeads, 0.17f, PodWindow{2, 6}, o);
    });
    EXPECT_EQ(out[0], out[1]) << dtype_name(dtype);
    on_both(t, [&](Pool& p, int) { t.cpu->kv_pair_values(std::vector<int32_t>{4}, std::vector<int32_t>{6}, p.view); });
    t.expect_rows_match("kv_pair_values");
  }
}

TEST(HalfKvPool, QuantizedGroupsSealOpenAndCompactAlike) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Twins t(dtype, KvQuant::int4, 7);
    auto quantized_bytes = [](const Pool& p, int k) {
      const uint8_t* b = p.view.block_quantized(p.packed_id(k));
      return std::vector<uint8_t>(b, b + p.layout.quantized_block_bytes());
    };
    on_both(t, [&](Pool& p, int) {
      t.cpu->kv_quantize(std::vector<int32_t>{0, 1}, std::vector<int32_t>{p.packed_id(0), p.packed_id(1)}, p.view);
      t.cpu->kv_dequantize(std::vector<int32_t>{p.packed_id(1)}, std::vector<int32_t>{4}, p.view);
    });
    EXPECT_EQ(quantized_bytes(t.wide, 0), quantized_bytes(t.half, 0)) << dtype_name(dtype);
    EXPECT_EQ(quantized_bytes(t.wide, 1), quantized_bytes(t.half, 1)) << dtype_name(dtype);
    t.expect_rows_match("kv_dequantize");
    // Two sealed groups and two full-precision blocks; every third entry dropped, so groups are rebuilt.
    std::vector<int32_t> kept;
    for (int e = 0; e < 100; ++e) {
      if (e % 3 != 2) kept.push_back(e);
    }
    on_both(t, [&](Pool& p, int) {
      const std::vector<int32_t> table = {p.packed_id(0), p.packed_id(1), 5, 6};
      t.cpu->kv_compact(table, kept, p.view, -1);
    });
    EXPECT_EQ(quantized_bytes(t.wide, 0), quantized_bytes(t.half, 0)) << dtype_name(dtype);
    EXPECT_EQ(quantized_bytes(t.wide, 1), quantized_bytes(t.half, 1)) << dtype_name(dtype);
    t.expect_rows_match("kv_compact after sealed groups");
  }
}

}  // namespace
}  // namespace strata
