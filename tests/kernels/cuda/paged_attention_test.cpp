// The CUDA backend's kv_write and paged attention (kernels/cuda/paged_attention.cu): the cache write against the
// CPU's (exactly), attention against the plain double-precision reference (tests/kernels/reference_attention.h)
// over full-precision, quantized and coded blocks, with GQA and column sums, at decode and prefill shapes.
//
// The device stores KV entries in bf16 (8 significant bits). Entries are bf16 numbers in both pools, the host's
// f32 pool that the reference reads and the device's bf16 one, so that a comparison measures the kernel's fp32
// arithmetic (~2^-24 relative per operation), not the storage; compare_attention states the bounds.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"
#include "tests/kernels/cuda/cuda_test_support.h"
#include "tests/kernels/reference_attention.h"

namespace strata {
namespace {

using test::bf16_bits;
using test::bf16_rounded;
using test::bf16_value;
using test::cuda_ok;
using test::expect_near_all;
using test::random_values;
using CudaPagedAttention = test::CudaTest;

// n_slots full-precision slots twice: f32 in host memory (the reference's, and the CPU backend's for the cache write)
// and bf16 in device memory, holding the same values (bf16 numbers); quantized blocks are sealed by the CPU backend
// and their bytes copied to where the device pool keeps the same id (f32 slots pack more quantized blocks than bf16
// ones). Coded blocks and codebook vectors (SpindleKV) are written to both as the same bytes, and both views get
// the same key RoPE table.
struct TwoPools {
  KvBlockLayout cpu_layout, gpu_layout;
  int32_t n_slots = 0;
  std::vector<float> cpu_memory;
  void* gpu_memory = nullptr;
  std::vector<float> cpu_rope;  // the key RoPE table, host and device copies
  float* gpu_rope = nullptr;
  KvPoolView cpu, gpu;

  TwoPools(KvBlockLayout layout, int32_t slots) : cpu_layout(layout), gpu_layout(layout), n_slots(slots) {
    cpu_layout.dtype = DType::f32;
    gpu_layout.dtype = DType::bf16;
    cpu_memory.assign(size_t(slots * cpu_layout.elements_per_block()), 0.0f);
    cuda_ok(cudaMalloc(&gpu_memory, size_t(slots * gpu_layout.block_bytes())), "cudaMalloc");
    cuda_ok(cudaMemset(gpu_memory, 0, size_t(slots * gpu_layout.block_bytes())), "cudaMemset");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the memset is async on the legacy stream
    cpu = KvPoolView{cpu_memory.data(), cpu_layout, slots, {}};
    gpu = KvPoolView{gpu_memory, gpu_layout, slots, {}};
  }
  ~TwoPools() {
    cudaFree(gpu_memory);
    cudaFree(gpu_rope);
  }
  TwoPools(const TwoPools&) = delete;
  TwoPools& operator=(const TwoPools&) = delete;

  // Host -> device at a byte offset. The backend's stream is not ordered with the legacy one, and a copy from
  // pageable memory may return before its DMA has finished: wait for the device before and after.
  void write(size_t offset, const void* host, size_t bytes) {
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_ok(cudaMemcpy(static_cast<uint8_t*>(gpu_memory) + offset, host, bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  // Random bf16 numbers in full-precision slots [0, n_full).
  void fill(int32_t n_full, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t n = size_t(n_full * cpu_layout.elements_per_block());
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) {
      bits[i] = bf16_bits(normal(rng));
      cpu_memory[i] = bf16_value(bits[i]);
    }
    write(0, bits.data(), n * 2);
  }

  // The id of the q-th quantized block placed after the first `after_slot` slots in both layouts.
  int32_t quantized_id(int32_t after_slot, int q) const {
    const int32_t id = n_slots + after_slot * cpu_layout.quantized_per_slot() + q;
    if ((id - n_slots) / gpu_layout.quantized_per_slot() >= n_slots) throw std::logic_error("test pool too small");
    return id;
  }

  // Seals full slot src into quantized block dst with the CPU backend; the device gets the same bytes.
  void seal(Backend& cpu_backend, int32_t src, int32_t dst) {
    const int32_t s[] = {src}, d[] = {dst};
    cpu_backend.kv_quantize(s, d, cpu);
    const size_t offset = size_t(gpu.block_quantized(dst) - static_cast<uint8_t*>(gpu.base));
    write(offset, cpu.block_quantized(dst), size_t(cpu_layout.quantized_block_bytes()));
  }

  // The key RoPE table of `params` for positions [0, n_positions), in both views.
  void set_key_rope(const RopeParams& params, int n_positions) {
    const size_t n = size_t(n_positions) * cpu_layout.head_dim;
    cpu_rope.resize(n);
    key_rope_table(cpu_layout.head_dim, params, n_positions, cpu_rope.data());
    cuda_ok(cudaFree(gpu_rope), "cudaFree");
    cuda_ok(cudaMalloc(&gpu_rope, n * sizeof(float)), "cudaMalloc");
    cuda_ok(cudaMemcpy(gpu_rope, cpu_rope.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // as in write(): the copy is done before any use
    cpu.key_rope = KvKeyRope{cpu_rope.data(), n_positions, params.style};
    gpu.key_rope = KvKeyRope{gpu_rope, n_positions, params.style};
  }

  // The code rows of coded block `id`, [n_kv_heads][block_size], in both pools.
  void write_code_rows(int32_t id, const std::vector<KvCodeRow>& rows) {
    const size_t bytes = rows.size() * sizeof(KvCodeRow);
    std::memcpy(cpu.block_coded(id), rows.data(), bytes);
    write(size_t(reinterpret_cast<uint8_t*>(gpu.block_coded(id)) - static_cast<uint8_t*>(gpu.base)), rows.data(),
          bytes);
  }

  // Codebook vectors first, first + 1, ... (head_dim fp32 values each, one after another) in both pools.
  void write_vectors(int32_t first, const std::vector<float>& vectors) {
    std::memcpy(cpu.codebook_vector(first), vectors.data(), vectors.size() * sizeof(float));
    write(size_t(first) * cpu_layout.head_dim * sizeof(float), vectors.data(), vectors.size() * sizeof(float));
  }

  // The device pool's full-precision slots, widened to f32.
  std::vector<float> gpu_full_slots() const {
    const size_t n = size_t(n_slots * gpu_layout.elements_per_block());
    std::vector<uint16_t> bits(n);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_ok(cudaMemcpy(bits.data(), gpu_memory, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = bf16_value(bits[i]);
    return v;
  }
};

// Slots 0 .. n - 1.
std::vector<int32_t> slot_ids(int n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

// One sequence of an attention test: rows and context, its block table, and whether it collects column sums
// (from which of its rows).
struct SeqSpec {
  int n_q;
  int n_ctx_before;
  int stats_from = -1;  // -1: no column sums
};

// Block tables drawn without repetition from `free_slots` (shuffled: the blocks of a table are not contiguous),
// after `quantized` leading quantized ids for quantized sequences.
struct Tables {
  std::vector<std::vector<int32_t>> tables;
  Tables(const std::vector<SeqSpec>& specs, int block_size, std::vector<int32_t> free_slots,
         const std::vector<std::vector<int32_t>>& leading, std::mt19937& rng) {
    std::shuffle(free_slots.begin(), free_slots.end(), rng);
    size_t next = 0;
    for (size_t s = 0; s < specs.size(); ++s) {
      const int n_blocks = (specs[s].n_ctx_before + specs[s].n_q + block_size - 1) / block_size;
      std::vector<int32_t> t = s < leading.size() ? leading[s] : std::vector<int32_t>{};
      while (int(t.size()) < n_blocks) {
        if (next >= free_slots.size()) throw std::logic_error("test pool too small for the tables");
        t.push_back(free_slots[next++]);
      }
      tables.push_back(std::move(t));
    }
  }
};

// Runs paged attention on the device over `pools` and compares outputs and column sums with the double reference
// over the host pool, which holds the same numbers (tests/kernels/reference_attention.h). The device's error is
// fp32 arithmetic alone (its order, expf, the dequantization folded into the dot products): outputs within
// 2e-5 + 1e-4 |want| (|v| <= ~5); column sums within 1e-4 of the cell plus 1e-6 per stats row. Each probability is
// within ~1e-5 relative, and a cell holds at least the 0.25 it started with; a bound of 1e-4 per row would hide a
// 15% error in a 1,500-entry decode, whose probabilities are ~7e-4.
void compare_attention(Backend& gpu, TwoPools& pools, int n_heads, const std::vector<SeqSpec>& specs,
                       const Tables& tables, std::mt19937& rng, const std::string& what) {
  const KvBlockLayout& L = pools.cpu_layout;
  const int64_t width = int64_t(n_heads) * L.head_dim;
  std::vector<AttentionSequence> seqs;
  std::vector<std::vector<float>> sums(specs.size());
  int rows = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    AttentionSequence a{rows, specs[s].n_q, specs[s].n_ctx_before, tables.tables[s]};
    rows += specs[s].n_q;
    if (specs[s].stats_from >= 0) {
      a.sums_stride = specs[s].n_ctx_before + specs[s].n_q + 3;  // wider than the entries, as the model's
      sums[s].assign(size_t(n_heads * a.sums_stride), 0.25f);    // sums already hold earlier steps' values
      a.column_sums = sums[s].data();
      a.stats_row_begin = specs[s].stats_from;
    }
    seqs.push_back(a);
  }
  const std::vector<float> q = random_values(size_t(rows * width), rng, -1.5f, 1.5f);
  const float scale = 1.0f / std::sqrt(float(L.head_dim));
  const test::ReferenceAttention want = test::reference_paged_attention(q, seqs, pools.cpu, n_heads, scale);

  Tensor qd = gpu.alloc(rows, width, DType::f32), out = gpu.alloc(rows, width, DType::f32);
  gpu.copy_from_host(q.data(), qd);
  gpu.paged_attention(qd, seqs, pools.gpu, n_heads, scale, out);
  std::vector<float> got(q.size());
  gpu.copy_to_host(out, got.data());
  expect_near_all(got, want.out, 2e-5f, 1e-4f, what + ": attention output");
  for (size_t s = 0; s < specs.size(); ++s) {
    if (specs[s].stats_from < 0) continue;
    std::vector<double> cells = want.column_sums[s];
    for (double& cell : cells) cell += 0.25;
    const float tol = 1e-6f * float(std::max(1, specs[s].n_q - specs[s].stats_from));
    expect_near_all(sums[s], cells, tol, 1e-4f, what + ": column sums of sequence " + std::to_string(s));
  }
  gpu.free(qd);
  gpu.free(out);
}

// The step's keys and values land in the same cells on both backends: exactly, since k and v are bf16 numbers.
TEST_F(CudaPagedAttention, KvWriteStoresTheStepsEntriesAsBf16) {
  TwoPools pools(KvBlockLayout{3, 64, 16, DType::f32, KvQuant::none}, 12);
  const std::vector<SeqSpec> specs = {{5, 0}, {1, 37}, {20, 9}};
  Tables tables(specs, 16, slot_ids(12), {}, rng);
  std::vector<AttentionSequence> seqs;
  int rows = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    seqs.push_back(AttentionSequence{rows, specs[s].n_q, specs[s].n_ctx_before, tables.tables[s]});
    rows += specs[s].n_q;
  }
  const int64_t width = 3 * 64;
  std::vector<float> k = bf16_rounded(random_values(size_t(rows * width), rng));
  std::vector<float> v = bf16_rounded(random_values(size_t(rows * width), rng));
  cpu->kv_write(on_cpu(k, rows, width), on_cpu(v, rows, width), seqs, pools.cpu);
  gpu->kv_write(device(k, rows, width), device(v, rows, width), seqs, pools.gpu);
  EXPECT_EQ(pools.gpu_full_slots(), pools.cpu_memory);
}

TEST_F(CudaPagedAttention, SmolLm2ShapesDecodeAndPrefill) {
  // GQA 9/3, head_dim 64, blocks of 16: decodes at several context lengths (the first entry, mid-block, long),
  // prefill chunks from the start and after earlier entries, and a chunk of exactly one tile.
  TwoPools pools(KvBlockLayout{3, 64, 16, DType::f32, KvQuant::none}, 160);
  pools.fill(160, rng);
  const std::vector<SeqSpec> specs = {{1, 0, 0},  {1, 37},     {1, 1500, 0}, {45, 0, 10},
                                      {70, 100},  {32, 16, 31}, {3, 5}};
  compare_attention(*gpu, pools, 9, specs, Tables(specs, 16, slot_ids(160), {}, rng), rng, "GQA 9/3, head_dim 64");
}

TEST_F(CudaPagedAttention, LlamaShapesDecodeAndPrefill) {
  // GQA 32/8, head_dim 128: a long decode (many splits) beside short ones and a prefill chunk with column sums.
  TwoPools pools(KvBlockLayout{8, 128, 16, DType::f32, KvQuant::none}, 240);
  pools.fill(240, rng);
  const std::vector<SeqSpec> specs = {{1, 3000}, {1, 63, 0}, {33, 17, 0}, {1, 16}};
  compare_attention(*gpu, pools, 32, specs, Tables(specs, 16, slot_ids(240), {}, rng), rng, "GQA 32/8, head_dim 128");
}

TEST_F(CudaPagedAttention, GroupsBeyondOneDecodeBlock) {
  // GQA 40/2 (20 query heads per KV head, as Llama 3.1 405B has 16): a decode block holds 8 query heads, so each
  // KV head's decodes take three blocks, the last with 4 heads. Decodes short and long, a prefill with column sums.
  TwoPools pools(KvBlockLayout{2, 128, 16, DType::f32, KvQuant::none}, 120);
  pools.fill(120, rng);
  const std::vector<SeqSpec> specs = {{1, 1200, 0}, {1, 9}, {20, 30, 4}};
  compare_attention(*gpu, pools, 40, specs, Tables(specs, 16, slot_ids(120), {}, rng), rng, "GQA 40/2, head_dim 128");
}

// Quantized pools: each table starts with quantized groups (sealed by the CPU) and continues in bf16 blocks.
void quantized_attention(Backend& gpu, Backend& cpu, KvQuant quant, int n_heads, int n_kv_heads, int head_dim,
                         std::mt19937& rng) {
  const int32_t n_full = 40;
  const std::vector<SeqSpec> specs = {{1, 100, 0}, {1, 64}, {40, 70, 5}, {6, 32}};
  const std::vector<int> n_quantized = {3, 2, 2, 1};  // full groups of 32 before each sequence's new rows
  const KvBlockLayout layout{n_kv_heads, head_dim, kKvQuantGroup, DType::f32, quant};
  KvBlockLayout f32_layout = layout, bf16_layout = layout;
  f32_layout.dtype = DType::f32;
  bf16_layout.dtype = DType::bf16;
  // Room after the full slots for 8 quantized blocks in both layouts (quantized_id numbers them from slot n_full
  // of the f32 layout, which packs more per slot).
  const int32_t n_slots = n_full + (n_full * f32_layout.quantized_per_slot() + 8) / bf16_layout.quantized_per_slot() + 1;
  TwoPools pools(layout, n_slots);
  pools.fill(n_full, rng);
  std::vector<std::vector<int32_t>> leading(specs.size());
  int q = 0, src = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int i = 0; i < n_quantized[s]; ++i) {
      const int32_t id = pools.quantized_id(n_full, q++);
      pools.seal(cpu, src++ % n_full, id);
      leading[s].push_back(id);
    }
  }
  compare_attention(gpu, pools, n_heads, specs, Tables(specs, kKvQuantGroup, slot_ids(n_full), leading, rng), rng,
                    std::string(kv_quant_name(quant)) + " pool, GQA " + std::to_string(n_heads) +
                        "/" + std::to_string(n_kv_heads));
}

// Each width at both head_dims the kernels are built for: a lane's codes are 2 or 4 channels of its word (64: 4 to
// 16 bits of it, 128: 8 to 32).
TEST_F(CudaPagedAttention, ReadsInt8Blocks) {
  quantized_attention(*gpu, *cpu, KvQuant::int8, 9, 3, 64, rng);
  quantized_attention(*gpu, *cpu, KvQuant::int8, 32, 8, 128, rng);
}

TEST_F(CudaPagedAttention, ReadsInt4Blocks) {
  quantized_attention(*gpu, *cpu, KvQuant::int4, 9, 3, 64, rng);
  quantized_attention(*gpu, *cpu, KvQuant::int4, 32, 8, 128, rng);
}

TEST_F(CudaPagedAttention, ReadsInt2Blocks) {
  quantized_attention(*gpu, *cpu, KvQuant::int2, 9, 3, 64, rng);
  quantized_attention(*gpu, *cpu, KvQuant::int2, 32, 8, 128, rng);
}

// SpindleKV pools: each table starts with coded blocks and continues in bf16 blocks. Both pools hold the same code
// rows and the same fp32 codebook vectors and both views the same key RoPE table; the reference reconstructs a
// coded entry from them in double, the device in fp32 (a few roundings of 2^-24 relative each), which is within
// the fp32 error that compare_attention's bounds already allow.
void coded_attention(Backend& gpu, int n_heads, int n_kv_heads, int head_dim, const RopeParams& rope,
                     std::mt19937& rng, const std::string& what) {
  constexpr int kBlockSize = 16, kVectors = 64, kPositions = 4096;
  // A long decode (its coded blocks spread over several splits), a short one, and prefill chunks whose key tiles
  // of 32 straddle the last coded block; decode and prefill with column sums.
  const std::vector<SeqSpec> specs = {{1, 700, 0}, {1, 40}, {45, 70, 5}, {6, 33}};
  const std::vector<int> n_coded = {31, 1, 3, 2};  // leading coded blocks, all before the sequence's new rows
  KvBlockLayout f32_layout{n_kv_heads, head_dim, kBlockSize, DType::f32, KvQuant::none};
  KvBlockLayout bf16_layout = f32_layout;
  bf16_layout.dtype = DType::bf16;
  // Where things go, valid in both pools: coded block q (id n_slots + q) lies in slot q / coded_per_slot() and
  // codebook vector i in slot i / vectors_per_slot(), and a bf16 slot holds half as many of either as an f32
  // one. So: the coded blocks in the slots the bf16 layout needs for them; the codebook vectors from the first
  // slot past those in the f32 layout (a later one in the bf16 layout); the tables' full-precision blocks after
  // the last slot holding a vector in the bf16 layout (an earlier one in the f32 layout).
  const int total_coded = std::accumulate(n_coded.begin(), n_coded.end(), 0);
  const int coded_slots = (total_coded + bf16_layout.coded_per_slot() - 1) / bf16_layout.coded_per_slot();
  const int32_t first_vector = int32_t(coded_slots * f32_layout.vectors_per_slot());
  const int32_t full_begin = int32_t((first_vector + kVectors - 1) / bf16_layout.vectors_per_slot()) + 1;
  int n_full = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    n_full += (specs[s].n_ctx_before + specs[s].n_q + kBlockSize - 1) / kBlockSize - n_coded[s];
  }
  const int32_t n_slots = full_begin + n_full;
  TwoPools pools(f32_layout, n_slots);
  pools.fill(n_slots, rng);  // the coded blocks and codebook vectors below overwrite their part
  pools.set_key_rope(rope, kPositions);

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> vectors(size_t(kVectors) * head_dim);  // random unit vectors
  for (int i = 0; i < kVectors; ++i) {
    float* u = vectors.data() + size_t(i) * head_dim;
    double square_sum = 0.0;
    for (int d = 0; d < head_dim; ++d) {
      u[d] = normal(rng);
      square_sum += double(u[d]) * u[d];
    }
    for (int d = 0; d < head_dim; ++d) u[d] = float(u[d] / std::sqrt(square_sum));
  }
  pools.write_vectors(first_vector, vectors);

  // Magnitudes around the norm of the full-precision entries (normal channels: sqrt(head_dim)).
  const float typical_norm = std::sqrt(float(head_dim));
  std::uniform_real_distribution<float> magnitude(0.5f * typical_norm, 1.5f * typical_norm);
  std::uniform_int_distribution<int32_t> vector_id(first_vector, first_vector + kVectors - 1);
  std::uniform_int_distribution<int32_t> position(0, kPositions - 1);
  std::vector<std::vector<int32_t>> leading(specs.size());
  int32_t next_coded = n_slots;
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int b = 0; b < n_coded[s]; ++b) {
      std::vector<KvCodeRow> rows(size_t(n_kv_heads) * kBlockSize);
      for (KvCodeRow& row : rows) row = {vector_id(rng), magnitude(rng), vector_id(rng), magnitude(rng), position(rng)};
      pools.write_code_rows(next_coded, rows);
      leading[s].push_back(next_coded++);
    }
  }
  std::vector<int32_t> full_slots(static_cast<size_t>(n_full));
  std::iota(full_slots.begin(), full_slots.end(), full_begin);
  compare_attention(gpu, pools, n_heads, specs, Tables(specs, kBlockSize, full_slots, leading, rng), rng, what);
}

TEST_F(CudaPagedAttention, ReadsCodedBlocksWithInterleavedRope) {
  // SmolLM2's shape and RoPE: GQA 9/3, head_dim 64, interleaved pairs.
  coded_attention(*gpu, 9, 3, 64, RopeParams{RopeStyle::interleaved, 100000.0f, {}}, rng,
                  "coded blocks, GQA 9/3, head_dim 64, interleaved RoPE");
}

TEST_F(CudaPagedAttention, ReadsCodedBlocksWithNeoxRope) {
  // GQA 32/8, head_dim 128, neox pairs (i, i + 64) and Llama 3.1's frequency scaling.
  const RopeParams llama31{RopeStyle::half_split, 500000.0f, RopeScaling{8.0f, 1.0f, 4.0f, 8192}};
  coded_attention(*gpu, 32, 8, 128, llama31, rng, "coded blocks, GQA 32/8, head_dim 128, neox RoPE");
}

// A coded key cannot be read without the pool's key RoPE table; with one, ids past the pool's coded blocks are
// still refused.
TEST_F(CudaPagedAttention, NeedsAKeyRopeTableForCodedBlocks) {
  TwoPools pools(KvBlockLayout{3, 64, 16, DType::f32, KvQuant::none}, 8);
  const std::vector<int32_t> table = {8, 5};  // id 8 = n_slots: a coded block in a pool without quantization
  const AttentionSequence seq{0, 1, 20, table};
  Tensor q = gpu->alloc(1, 9 * 64, DType::f32), out = gpu->alloc(1, 9 * 64, DType::f32);
  try {
    gpu->paged_attention(q, {&seq, 1}, pools.gpu, 9, 0.125f, out);
    ADD_FAILURE() << "a coded block without a key RoPE table was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("paged_attention"), std::string::npos) << e.what();
  }
  pools.set_key_rope(RopeParams{}, 64);
  // The pool is zeroed: the coded rows name vector 0 (zeros) with magnitude 0, and every key and value is 0. A
  // zero query then attends evenly over zeros: the output is 0, read back so that a fault on the device shows.
  const std::vector<float> zeros(size_t(9 * 64), 0.0f);
  gpu->copy_from_host(zeros.data(), q);
  EXPECT_NO_THROW(gpu->paged_attention(q, {&seq, 1}, pools.gpu, 9, 0.125f, out));
  std::vector<float> got(zeros.size(), 1.0f);
  gpu->copy_to_host(out, got.data());
  EXPECT_EQ(got, zeros);
  const std::vector<int32_t> past = {8 + 8 * pools.gpu_layout.coded_per_slot(), 5};
  const AttentionSequence past_seq{0, 1, 20, past};
  EXPECT_THROW(gpu->paged_attention(q, {&past_seq, 1}, pools.gpu, 9, 0.125f, out), std::invalid_argument);
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
