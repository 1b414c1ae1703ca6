// The CPU backend's paged attention (kernels/cpu/paged_attention.cpp) against the plain double-precision reference
// that the CUDA twin is tested against too (tests/kernels/reference_attention.h), on random pools of every block
// format: full precision, KIVI-quantized (sealed by the CPU's kv_quantize) and SpindleKV-coded, with GQA, column
// sums, decode steps and prefill chunks long enough for the op's transposed-key tiles. So the reference is checked
// here on every build, GPU or none.
//
// Bounds: the op's error is fp32 arithmetic (its order, the vectorised exp within 1.1e-7, the dequantization folded
// into the dot products): outputs within 2e-5 + 1e-4 |want|, column sums within 1e-4 of the cell plus 1e-6 per
// stats row, as the CUDA tests allow.
#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/quantized_dot.h"
#include "kernels/kv_block_layout.h"
#include "kernels/kv_codebook.h"
#include "tests/kernels/reference_attention.h"

namespace strata {
namespace {

// One sequence: its rows and earlier entries, how many of its leading blocks are quantized or coded (all before
// its new rows, which are written to full-precision blocks), and from which row it collects column sums.
struct SeqSpec {
  int n_q;
  int n_ctx_before;
  int n_packed = 0;
  int stats_from = -1;  // -1: no column sums
};

constexpr int kVectors = 48, kPositions = 1024;


// A pool in host memory for `specs`: full-precision slots of random entries (16-bit ones as the nearest of the
// layout's type to a normal sample, tests/kernels/half_reference.h), then the
// slots of the packed
// blocks (quantized ones sealed from random slots of their own, or coded ones with random code rows), then
// codebook vectors. The tables start with their packed blocks and continue in shuffled full-precision slots.
struct RandomPool {
  std::vector<float> memory;
  std::vector<float> rope_table;
  KvPoolView view;
  std::vector<std::vector<int32_t>> tables;

  RandomPool(const KvBlockLayout& layout, const std::vector<SeqSpec>& specs, const RopeParams& rope,
             std::mt19937& rng) {
    int n_full = 0, n_packed = 0;
    for (const SeqSpec& s : specs) {
      n_full += (s.n_ctx_before + s.n_q + layout.block_size - 1) / layout.block_size - s.n_packed;
      n_packed += s.n_packed;
    }
    const bool quantized = layout.quant != KvQuant::none;
    const int n_sources = quantized ? n_packed : 0;  // full slots sealed into the quantized blocks
    const int packed_slots = (n_packed + layout.packed_per_slot() - 1) / layout.packed_per_slot();
    const int first_vector_slot = n_full + n_sources + packed_slots;
    const int vector_slots = int((kVectors + layout.vectors_per_slot() - 1) / layout.vectors_per_slot());
    const int32_t n_slots = first_vector_slot + vector_slots;
    memory.resize(size_t(n_slots * layout.elements_per_block()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : memory) x = normal(rng);
    if (layout.dtype != DType::f32) {  // the 16-bit elements of the slots take the first half of the memory
      auto* halves = reinterpret_cast<uint16_t*>(memory.data());
      for (size_t i = 0; i < memory.size(); ++i) halves[i] = test::round_to_half(memory[i], layout.dtype);
    }
    view = KvPoolView{memory.data(), layout, n_slots, {}};
    if (!quantized && n_packed > 0) {
      rope_table.resize(size_t(kPositions) * layout.head_dim);
      key_rope_table(layout.head_dim, rope, kPositions, rope_table.data());
      view.key_rope = KvKeyRope{rope_table.data(), kPositions, rope.style};
    }

    std::vector<int32_t> packed(static_cast<size_t>(n_packed));
    std::iota(packed.begin(), packed.end(), n_slots + (n_full + n_sources) * layout.packed_per_slot());
    if (quantized) {
      std::vector<int32_t> sources(packed.size());
      std::iota(sources.begin(), sources.end(), n_full);
      make_cpu_backend()->kv_quantize(sources, packed, view);
    } else {
      write_codes(packed, int32_t(first_vector_slot * layout.vectors_per_slot()), rng);
    }
    std::vector<int32_t> full(static_cast<size_t>(n_full));
    std::iota(full.begin(), full.end(), 0);
    std::shuffle(full.begin(), full.end(), rng);
    auto next_packed = packed.begin();
    auto next_full = full.begin();
    for (const SeqSpec& s : specs) {
      std::vector<int32_t> table(next_packed, next_packed + s.n_packed);
      next_packed += s.n_packed;
      const int n_blocks = (s.n_ctx_before + s.n_q + layout.block_size - 1) / layout.block_size;
      table.insert(table.end(), next_full, next_full + (n_blocks - s.n_packed));
      next_full += n_blocks - s.n_packed;
      tables.push_back(std::move(table));
    }
  }

  // Random unit codebook vectors from `first_vector` on, and code rows naming them with magnitudes around the
  // norm of a full-precision entry (sqrt(head_dim)) at random positions.
  void write_codes(const std::vector<int32_t>& coded, int32_t first_vector, std::mt19937& rng) {
    const int hd = view.layout.head_dim;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int i = 0; i < kVectors; ++i) {
      float* u = view.codebook_vector(first_vector + i);
      double square_sum = 0.0;
      for (int d = 0; d < hd; ++d) {
        u[d] = normal(rng);
        square_sum += double(u[d]) * u[d];
      }
      for (int d = 0; d < hd; ++d) u[d] = float(u[d] / std::sqrt(square_sum));
    }
    std::uniform_int_distribution<int32_t> vector(first_vector, first_vector + kVectors - 1);
    std::uniform_int_distribution<int32_t> position(0, kPositions - 1);
    std::uniform_real_distribution<float> magnitude(0.5f * std::sqrt(float(hd)), 1.5f * std::sqrt(float(hd)));
    for (int32_t id : coded) {
      KvCodeRow* rows = view.block_coded(id);
      for (int i = 0; i < view.layout.n_kv_heads * view.layout.block_size; ++i) {
        rows[i] = {vector(rng), magnitude(rng), vector(rng), magnitude(rng), position(rng)};
      }
    }
  }
};

// maxima: every sequence with statistics asks for KVzip's column maxima over these entries instead of sums.
void expect_matches_reference(const KvBlockLayout& layout, int n_heads, const std::vector<SeqSpec>& specs,
                              const RopeParams& rope, uint32_t seed, const std::string& what,
                              std::optional<ColumnMaxima> maxima = std::nullopt) {
  std::mt19937 rng(seed);
  const RandomPool pool(layout, specs, rope, rng);
  std::vector<AttentionSequence> seqs;
  std::vector<std::vector<float>> sums(specs.size());
  int rows = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    AttentionSequence a{rows, specs[s].n_q, specs[s].n_ctx_before, pool.tables[s]};
    rows += specs[s].n_q;
    if (specs[s].stats_from >= 0) {
      a.sums_stride = specs[s].n_ctx_before + specs[s].n_q + 3;
      sums[s].assign(size_t(n_heads * a.sums_stride), 0.25f);  // sums are added to what is there
      a.column_sums = sums[s].data();
      a.stats_row_begin = specs[s].stats_from;
      a.column_maxima = maxima;
    }
    seqs.push_back(a);
  }
  const int64_t width = int64_t(n_heads) * layout.head_dim;
  std::vector<float> q(size_t(rows * width)), out(q.size());
  std::uniform_real_distribution<float> uniform(-1.5f, 1.5f);
  for (float& x : q) x = uniform(rng);
  const float scale = 1.0f / std::sqrt(float(layout.head_dim));
  const test::ReferenceAttention want = test::reference_paged_attention(q, seqs, pool.view, n_heads, scale);
  Tensor out_tensor{out.data(), DType::f32, rows, width};
  make_cpu_backend()->paged_attention(Tensor{q.data(), DType::f32, rows, width}, seqs, pool.view, n_heads, scale,
                                      out_tensor);

  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], want.out[i], 2e-5 + 1e-4 * std::fabs(want.out[i])) << what << ": output element " << i;
  }
  for (size_t s = 0; s < specs.size(); ++s) {
    if (specs[s].stats_from < 0) continue;
    const double rows_tolerance = 1e-6 * std::max(1, specs[s].n_q - specs[s].stats_from);
    for (size_t c = 0; c < sums[s].size(); ++c) {
      // Sums add to what is there; a maximum replaces it where larger.
      const double cell = maxima ? std::max(0.25, want.column_sums[s][c]) : 0.25 + want.column_sums[s][c];
      ASSERT_NEAR(sums[s][c], cell, rows_tolerance + 1e-4 * cell) << what << ": sequence " << s << " cell " << c;
    }
  }
}

// Decode steps short and long (split along their keys past 128: spans of 128 keys, at most 8 spans),
// prefill chunks from the start and after earlier entries; column sums on a decode and on a chunk.
const std::vector<SeqSpec> kFullPrecision = {{1, 0, 0, 0}, {1, 150}, {40, 0, 0, 10}, {23, 37}, {1, 70, 0, 0}, {1, 40},
                                             {1, 1000}};

TEST(CpuPagedAttention, FullPrecisionBlocksMatchTheDoubleReference) {
  const RopeParams none{};
  expect_matches_reference(KvBlockLayout{3, 64, 16}, 9, kFullPrecision, none, 1, "GQA 9/3, head_dim 64");
  expect_matches_reference(KvBlockLayout{4, 32, 5}, 4, kFullPrecision, none, 2, "MHA 4/4, blocks of 5");
  expect_matches_reference(KvBlockLayout{1, 80, 16}, 6, kFullPrecision, none, 3, "MQA 6/1, head_dim 80");
}

// KVzip's statistic: the rows' probabilities renormalized over the sinks and the entries from 30 on (a chunk and the
// rows after it), the largest of each; the entries between keep what they held.
TEST(CpuPagedAttention, ColumnMaximaMatchTheDoubleReference) {
  const std::vector<SeqSpec> specs = {{40, 0, 0, 10}, {23, 37, 0, 0}, {1, 70, 0, 0}, {12, 90, 0, 4}};
  expect_matches_reference(KvBlockLayout{3, 64, 16}, 9, specs, RopeParams{}, 7, "maxima, GQA 9/3", ColumnMaxima{4, 30});
  expect_matches_reference(KvBlockLayout{2, 32, 5}, 2, specs, RopeParams{}, 8, "maxima, no sinks", ColumnMaxima{0, 0});
  const std::vector<SeqSpec> quantized = {{30, 70, 2, 5}, {6, 32, 1, 0}};
  const KvBlockLayout int4{2, 64, kKvQuantGroup, DType::f32, KvQuant::int4};
  expect_matches_reference(int4, 8, quantized, RopeParams{}, 9, "maxima, int4 groups", ColumnMaxima{4, 40});
}

// The sequences of `specs` one after another in a step's rows (their count in `rows`), on the pool's tables, and
// their queries.
std::vector<AttentionSequence> step_sequences(const std::vector<SeqSpec>& specs, const RandomPool& pool, int& rows) {
  std::vector<AttentionSequence> seqs;
  rows = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    seqs.push_back(AttentionSequence{rows, specs[s].n_q, specs[s].n_ctx_before, pool.tables[s]});
    rows += specs[s].n_q;
  }
  return seqs;
}
std::vector<float> random_queries(int64_t n, std::mt19937& rng) {
  std::vector<float> q(static_cast<size_t>(n));
  std::uniform_real_distribution<float> uniform(-1.5f, 1.5f);
  for (float& x : q) x = uniform(rng);
  return q;
}

// A decode row split along its keys is cut by its own length alone: it gets the same bits alone as beside other
// decode rows and a prefill chunk (the engine's "batched = alone" rests on it).
TEST(CpuPagedAttention, SplitDecodeRowsGetTheSameBitsInAnyBatch) {
  const KvBlockLayout layout{3, 64, 16};
  const int n_heads = 9;
  const int64_t width = int64_t(n_heads) * layout.head_dim;
  const std::vector<SeqSpec> specs = {{1, 500}, {20, 30}, {1, 90}, {1, 2000}};
  std::mt19937 rng(11);
  const RandomPool pool(layout, specs, RopeParams{}, rng);
  int rows = 0;
  const std::vector<AttentionSequence> batch = step_sequences(specs, pool, rows);
  std::vector<float> q = random_queries(rows * width, rng);
  std::vector<float> together(q.size());
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const float scale = 0.125f;
  Tensor together_out{together.data(), DType::f32, rows, width};
  cpu->paged_attention(Tensor{q.data(), DType::f32, rows, width}, batch, pool.view, n_heads, scale, together_out);
  for (size_t s = 0; s < specs.size(); ++s) {
    if (specs[s].n_q != 1) continue;
    AttentionSequence alone = batch[s];
    alone.q_begin = 0;
    std::vector<float> out(static_cast<size_t>(width));
    Tensor alone_out{out.data(), DType::f32, 1, width};
    cpu->paged_attention(Tensor{q.data() + batch[s].q_begin * width, DType::f32, 1, width}, {&alone, 1}, pool.view,
                         n_heads, scale, alone_out);
    EXPECT_EQ(0, std::memcmp(out.data(), together.data() + batch[s].q_begin * width, sizeof(float) * size_t(width)))
        << "decode row of sequence " << s << " after " << specs[s].n_ctx_before << " entries";
  }
}

// The op's register blocking follows the CPU level (8 rows' scores and values in zmm registers on AVX-512, 4 rows
// and ymm below): every row gets the same bits at each level the machine has, in prefill tiles and decode steps.
TEST(CpuPagedAttention, EveryLevelGivesTheSameBits) {
  const std::vector<SeqSpec> specs = {{40, 0}, {23, 37}, {1, 300}, {1, 40}, {7, 90}};
  for (const KvBlockLayout& layout : {KvBlockLayout{3, 64, 16}, KvBlockLayout{1, 80, 16, DType::bf16}}) {
    const int n_heads = layout.n_kv_heads == 3 ? 9 : 6;
    const int64_t width = int64_t(n_heads) * layout.head_dim;
    std::mt19937 rng(21);
    const RandomPool pool(layout, specs, RopeParams{}, rng);
    int rows = 0;
    const std::vector<AttentionSequence> seqs = step_sequences(specs, pool, rows);
    std::vector<float> q = random_queries(rows * width, rng);
    const std::unique_ptr<Backend> cpu = make_cpu_backend();
    const auto run = [&] {
      std::vector<float> out(q.size());
      Tensor out_tensor{out.data(), DType::f32, rows, width};
      cpu->paged_attention(Tensor{q.data(), DType::f32, rows, width}, seqs, pool.view, n_heads, 0.125f, out_tensor);
      return out;
    };
    const cpu::CpuIsa best = cpu::best_cpu_isa();
    const std::vector<float> at_best = run();
    for (const cpu::CpuIsa level : cpu::kCpuIsas) {
      if (level >= best) continue;
      cpu::limit_cpu_isa(level);
      const std::vector<float> limited = run();
      cpu::limit_cpu_isa(best);
      EXPECT_EQ(0, std::memcmp(limited.data(), at_best.data(), sizeof(float) * at_best.size()))
          << dtype_name(layout.dtype) << " pool, at " << cpu::cpu_isa_name(level) << " and " << cpu::cpu_isa_name(best);
    }
  }
}

TEST(CpuPagedAttention, QuantizedBlocksMatchTheDoubleReference) {
  // Groups of 32 before each sequence's new rows, then full-precision blocks.
  const std::vector<SeqSpec> specs = {{1, 100, 3, 0}, {1, 64, 2}, {30, 70, 2, 5}, {6, 32, 1}, {1, 300, 3}};
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4, KvQuant::int2}) {
    const KvBlockLayout layout{2, 64, kKvQuantGroup, DType::f32, quant};
    expect_matches_reference(layout, 8, specs, RopeParams{}, 4, kv_quant_name(quant));
  }
}

// 16-bit pools (kv_cache.dtype f16 | bf16): full-precision blocks alone, after quantized groups sealed from 16-bit
// staging blocks, and after SpindleKV's coded blocks (whose codebook vectors stay fp32).
TEST(CpuPagedAttention, HalfPoolsMatchTheDoubleReference) {
  const std::vector<SeqSpec> quantized = {{1, 100, 3, 0}, {30, 70, 2, 5}, {1, 300, 3}};
  const std::vector<SeqSpec> coded = {{1, 300, 18, 0}, {30, 70, 3, 5}, {6, 33, 2}};
  for (DType dtype : {DType::f16, DType::bf16}) {
    const std::string name = dtype_name(dtype);
    expect_matches_reference(KvBlockLayout{3, 64, 16, dtype}, 9, kFullPrecision, RopeParams{}, 12, name);
    expect_matches_reference(KvBlockLayout{1, 80, 5, dtype}, 6, kFullPrecision, RopeParams{}, 13, name + ", MQA");
    expect_matches_reference(KvBlockLayout{2, 64, kKvQuantGroup, dtype, KvQuant::int4}, 8, quantized, RopeParams{},
                             14, name + " staging, int4");
    expect_matches_reference(KvBlockLayout{3, 64, 16, dtype}, 9, coded, RopeParams{}, 15, name + ", coded");
  }
}

TEST(CpuPagedAttention, CodedBlocksMatchTheDoubleReference) {
  const std::vector<SeqSpec> specs = {{1, 300, 18, 0}, {1, 40, 1}, {30, 70, 3, 5}, {6, 33, 2}};
  const RopeParams interleaved{RopeStyle::interleaved, 100000.0f, {}};
  const RopeParams llama31{RopeStyle::half_split, 500000.0f, RopeScaling{8.0f, 1.0f, 4.0f, 8192}};
  expect_matches_reference(KvBlockLayout{3, 64, 16}, 9, specs, interleaved, 5, "coded, interleaved RoPE");
  expect_matches_reference(KvBlockLayout{2, 128, 16}, 8, specs, llama31, 6, "coded, neox RoPE, Llama 3.1 scaling");
}

}  // namespace
}  // namespace strata
