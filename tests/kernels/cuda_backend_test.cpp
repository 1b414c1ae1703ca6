// The CUDA backend's model ops against their CPU twins (kernels/cpu/), on random inputs, and SmolLM2-135M run
// through LlamaModel on both backends. Without a GPU (or without a CUDA build) every test reports itself skipped
// with the reason.
//
// Tolerances. The CUDA backend stores weights, GEMM inputs and KV entries in bf16: 8 significant bits, so one
// rounding costs up to 2^-9 relative. Inputs that the device keeps in bf16 are rounded to bf16 before the CPU
// sees them, so that a comparison measures the kernel (fp32 arithmetic in another order: ~2^-24 relative per
// operation), not the storage; each test states its bound where it checks it.
#ifdef STRATA_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/kv_codebook.h"
#include "model/gguf_file.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "tests/kernels/cuda_test_support.h"
#include "tests/kernels/random_weight_blocks.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using test::bf16_bits;
using test::bf16_value;
using test::cuda_ok;
using test::round_bf16;

std::vector<float> random_values(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// Every |got - want| <= bound[i]; on failure, the worst element.
void expect_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  float worst_excess = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    const float excess = std::fabs(got[i] - want[i]) - bound[i];
    if (!(excess <= worst_excess)) {  // also catches NaN
      worst_excess = std::isnan(excess) ? INFINITY : excess;
      worst = i;
    }
  }
  EXPECT_LE(worst_excess, 0.0f) << what << ": element " << worst << " is " << got[worst] << ", want " << want[worst]
                                << " within " << bound[worst];
}
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, float abs_tol, float rel_tol,
                     const std::string& what) {
  std::vector<float> bound(want.size());
  for (size_t i = 0; i < want.size(); ++i) bound[i] = abs_tol + rel_tol * std::fabs(want[i]);
  expect_within(got, want, bound, what);
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    gpu = make_cuda_backend(0);
    cpu = make_cpu_backend();
  }

  // A device f32 tensor holding `host`.
  Tensor device(const std::vector<float>& host, int64_t rows, int64_t cols) {
    Tensor t = gpu->alloc(rows, cols, DType::f32);
    gpu->copy_from_host(host.data(), t);
    return t;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(size_t(t.size()));
    gpu->copy_to_host(t, v.data());
    return v;
  }
  // A host tensor for the CPU backend over `data`.
  static Tensor on_cpu(std::vector<float>& data, int64_t rows, int64_t cols) {
    return Tensor{data.data(), DType::f32, rows, cols};
  }

  std::unique_ptr<Backend> gpu, cpu;
  std::mt19937 rng{20261122};
};

TEST_F(CudaBackendTest, ReportsItsNameAndBf16Blocks) {
  EXPECT_EQ(gpu->name(), "cuda");
  EXPECT_EQ(gpu->kv_dtype(), DType::bf16);
  EXPECT_NE(cuda_stream(*gpu), nullptr);
  EXPECT_THROW(cuda_stream(*cpu), std::invalid_argument);
}

TEST_F(CudaBackendTest, AllocIsZeroedAndCopiesRoundTrip) {
  Tensor t = gpu->alloc(37, 19, DType::f32);
  EXPECT_EQ(host(t), std::vector<float>(37 * 19, 0.0f));
  const std::vector<float> v = random_values(37 * 19, rng);
  gpu->copy_from_host(v.data(), t);
  EXPECT_EQ(host(t), v);
  gpu->free(t);
  EXPECT_EQ(t.data, nullptr);
}

// The table's rows are bf16 values, so the gathered rows are exact.
TEST_F(CudaBackendTest, EmbeddingCopiesBf16RowsExactly) {
  const int64_t vocab = 101, d = 70;
  std::vector<float> table = bf16_rounded(random_values(size_t(vocab * d), rng));
  const std::vector<int32_t> ids = {5, 0, 100, 5, 42, 99, 1};
  Tensor w = gpu->upload_weight(WeightMatrix{table.data(), WeightFormat::f32, vocab, d});
  EXPECT_EQ(w.dtype, DType::bf16);
  Tensor out = gpu->alloc(int64_t(ids.size()), d, DType::f32);
  gpu->embedding(ids, w, out);
  std::vector<float> want(ids.size() * size_t(d));
  Tensor cpu_out = on_cpu(want, int64_t(ids.size()), d);
  cpu->embedding(ids, on_cpu(table, vocab, d), cpu_out);
  EXPECT_EQ(host(out), want);
  const std::vector<int32_t> bad = {101};
  EXPECT_THROW(gpu->embedding(bad, w, out), std::invalid_argument);
}

// fp32 sums of squares in another order: relative 1e-5 is ~100 ulps, far above the reordering error of 1,000
// terms and far below a bf16 step (2^-9 = 2e-3).
TEST_F(CudaBackendTest, RmsnormMatchesTheCpu) {
  for (int64_t d : {576, 1000}) {
    const int64_t rows = 5;
    std::vector<float> x = random_values(size_t(rows * d), rng, -3.0f, 3.0f);
    std::vector<float> w = bf16_rounded(random_values(size_t(d), rng, 0.5f, 1.5f));
    Tensor xd = device(x, rows, d), out = gpu->alloc(rows, d, DType::f32);
    gpu->rmsnorm(xd, gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, 1, d}), 1e-5f, out);
    std::vector<float> want(size_t(rows * d));
    Tensor cpu_out = on_cpu(want, rows, d);
    cpu->rmsnorm(on_cpu(x, rows, d), on_cpu(w, 1, d), 1e-5f, cpu_out);
    expect_near_all(host(out), want, 1e-6f, 1e-5f, "rmsnorm d=" + std::to_string(d));
  }
}

// expf against std::exp: a few ulps.
TEST_F(CudaBackendTest, SiluMulAddAndGatherRowsMatchTheCpu) {
  const int64_t rows = 9, cols = 1537;
  std::vector<float> gate = random_values(size_t(rows * cols), rng, -8.0f, 8.0f);
  std::vector<float> up = random_values(size_t(rows * cols), rng);
  Tensor g = device(gate, rows, cols), u = device(up, rows, cols), out = gpu->alloc(rows, cols, DType::f32);
  gpu->silu_mul(g, u, out);
  std::vector<float> want(size_t(rows * cols));
  Tensor cpu_out = on_cpu(want, rows, cols);
  cpu->silu_mul(on_cpu(gate, rows, cols), on_cpu(up, rows, cols), cpu_out);
  expect_near_all(host(out), want, 1e-7f, 1e-6f, "silu_mul");

  gpu->add(out, u);
  Tensor cpu_up = on_cpu(up, rows, cols);
  cpu->add(cpu_out, cpu_up);
  expect_near_all(host(out), want, 1e-7f, 1e-6f, "add");

  const std::vector<int64_t> pick = {8, 0, 3, 3};
  Tensor gathered = gpu->alloc(int64_t(pick.size()), cols, DType::f32);
  gpu->gather_rows(out, pick, gathered);
  const std::vector<float> all = host(out), got = host(gathered);
  for (size_t i = 0; i < pick.size(); ++i) {
    EXPECT_TRUE(std::equal(got.begin() + i * cols, got.begin() + (i + 1) * cols, all.begin() + pick[i] * cols))
        << "gathered row " << i;
  }
  const std::vector<int64_t> bad = {9};
  EXPECT_THROW(gpu->gather_rows(out, bad, gathered), std::invalid_argument);
}

// Bounds per output element, with S = sum_k |x_k w_k|:
//   x rounded to bf16 first (what the kernel multiplies): only fp32 accumulation differs, |error| <= K 2^-24 S
//   (the worst case of any summation order; typical errors are sqrt(K) smaller);
//   x as the model gives it: the device also rounds x, one bf16 rounding per product, |error| <= 2^-9 S plus the
//   above.
TEST_F(CudaBackendTest, MatmulMatchesTheCpuForOddShapes) {
  struct Shape {
    int64_t t, in, out;
  };
  for (const Shape& s : {Shape{1, 576, 1536}, Shape{517, 576, 49}, Shape{517, 1000, 333}, Shape{3, 64, 7}}) {
    const std::string name = std::to_string(s.t) + "x" + std::to_string(s.in) + " * " + std::to_string(s.out);
    std::vector<float> w = bf16_rounded(random_values(size_t(s.out * s.in), rng));
    std::vector<float> x = random_values(size_t(s.t * s.in), rng, -2.0f, 2.0f);
    std::vector<float> x_bf16 = bf16_rounded(x);
    Tensor wd = gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, s.out, s.in});
    Tensor out = gpu->alloc(s.t, s.out, DType::f32);

    std::vector<float> abs_sum(size_t(s.t * s.out), 0.0f);  // S per element
    for (int64_t t = 0; t < s.t; ++t) {
      for (int64_t o = 0; o < s.out; ++o) {
        float acc = 0.0f;
        for (int64_t k = 0; k < s.in; ++k) acc += std::fabs(x[size_t(t * s.in + k)] * w[size_t(o * s.in + k)]);
        abs_sum[size_t(t * s.out + o)] = acc;
      }
    }
    const float accumulation = float(s.in) * std::ldexp(1.0f, -24);

    std::vector<float> want(size_t(s.t * s.out));
    Tensor cpu_out = on_cpu(want, s.t, s.out);
    cpu->matmul(on_cpu(x_bf16, s.t, s.in), on_cpu(w, s.out, s.in), cpu_out);
    gpu->matmul(device(x_bf16, s.t, s.in), wd, out);
    std::vector<float> bound(abs_sum.size());
    for (size_t i = 0; i < bound.size(); ++i) bound[i] = accumulation * abs_sum[i] + 1e-6f;
    expect_within(host(out), want, bound, "matmul (bf16 x) " + name);

    cpu->matmul(on_cpu(x, s.t, s.in), on_cpu(w, s.out, s.in), cpu_out);
    gpu->matmul(device(x, s.t, s.in), wd, out);
    for (size_t i = 0; i < bound.size(); ++i) bound[i] = (std::ldexp(1.0f, -9) + accumulation) * abs_sum[i] + 1e-6f;
    expect_within(host(out), want, bound, "matmul (f32 x) " + name);
  }
  Tensor x = gpu->alloc(2, 5, DType::f32), out = gpu->alloc(2, 3, DType::f32);
  std::vector<float> w(4 * 5, 0.5f);
  EXPECT_THROW(gpu->matmul(x, gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, 4, 5}), out), std::invalid_argument);
}

// Same fp32 angles, cosines from double; the rotation may fuse multiply-adds: 1e-6 relative to |x| <= 1.
// Quantized weights go up dequantized (on the host) and rounded to bf16: the product is the CPU's (which multiplies
// the exact dequantized values, kernels/cpu/quantized_matmul.h) within one bf16 rounding of each weight and each
// input, |error| <= (2^-8 + K 2^-24) S.
TEST_F(CudaBackendTest, QuantizedWeightsUploadAsTheirValues) {
  const std::pair<WeightFormat, int64_t> formats[] = {
      {WeightFormat::q8_0, 96}, {WeightFormat::q4_0, 96}, {WeightFormat::q4_1, 576}, {WeightFormat::q4_k, 512},
      {WeightFormat::q6_k, 512}};
  for (const auto& [format, cols] : formats) {
    const int64_t rows = 37, t = 3;
    const std::vector<uint8_t> blocks = test::random_blocks(format, rows, cols, 7);
    const WeightMatrix w{blocks.data(), format, rows, cols};
    std::vector<float> x = random_values(size_t(t * cols), rng);
    std::vector<float> values(size_t(rows * cols)), want(size_t(t * rows));
    for (int64_t r = 0; r < rows; ++r) dequantize_weight_row(format, w.row(r), values.data() + r * cols, cols);
    Tensor cpu_out = on_cpu(want, t, rows);
    cpu->matmul(on_cpu(x, t, cols), cpu->upload_weight(w), cpu_out);
    Tensor out = gpu->alloc(t, rows, DType::f32);
    gpu->matmul(device(x, t, cols), gpu->upload_weight(w), out);
    std::vector<float> bound(want.size());
    for (int64_t a = 0; a < t; ++a) {
      for (int64_t r = 0; r < rows; ++r) {
        float s = 0.0f;
        for (int64_t k = 0; k < cols; ++k) s += std::fabs(x[size_t(a * cols + k)] * values[size_t(r * cols + k)]);
        bound[size_t(a * rows + r)] = (std::ldexp(1.0f, -8) + float(cols) * std::ldexp(1.0f, -24)) * s + 1e-6f;
      }
    }
    expect_within(host(out), want, bound, "quantized upload " + std::string(weight_format_info(format).name));
  }
}

TEST_F(CudaBackendTest, RopeMatchesTheCpuInBothLayoutsAndScaled) {
  const std::vector<int32_t> positions = {0, 1, 7, 100, 4095, 8191, 31999, 100000};
  const int64_t t = int64_t(positions.size());
  RopeParams scaled{RopeStyle::half_split, 500000.0f, RopeScaling{8.0f, 1.0f, 4.0f, 8192}};
  for (const RopeParams& params : {RopeParams{RopeStyle::interleaved, 10000.0f, {}},
                                   RopeParams{RopeStyle::half_split, 100000.0f, {}}, scaled}) {
    for (int head_dim : {64, 128}) {
      const int n_heads = 3;
      std::vector<float> x = random_values(size_t(t * n_heads * head_dim), rng);
      Tensor xd = device(x, t, int64_t(n_heads) * head_dim);
      gpu->rope(xd, positions, n_heads, head_dim, params);
      Tensor xc = on_cpu(x, t, int64_t(n_heads) * head_dim);
      cpu->rope(xc, positions, n_heads, head_dim, params);
      expect_near_all(host(xd), x, 2e-6f, 0.0f,
                      "rope style " + std::to_string(int(params.style)) + " theta " + std::to_string(params.theta) +
                          " factor " + std::to_string(params.scaling.factor) + " head_dim " +
                          std::to_string(head_dim));
    }
  }
}

// ---- The KV pool: the same contents for both backends ---------------------------------------------------------

// n_slots full-precision slots twice: f32 in host memory for the CPU backend and bf16 in device memory for the
// CUDA one, holding the same values (bf16 numbers); quantized blocks are sealed by the CPU backend and their bytes
// copied to where the device pool keeps the same id (f32 slots pack more quantized blocks than bf16 ones). Coded
// blocks and codebook vectors (SpindleKV) are written to both as the same bytes, and both views get the same key
// RoPE table.
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

// Runs paged attention on both backends over `pools` and compares outputs and column sums. The pools hold the
// same numbers and q is the same, so the differences are fp32 arithmetic only (order, expf, the dequantization
// folded differently): outputs within 2e-5 + 1e-4 |want| (|v| <= ~5); column sums within 1e-4 of the cell plus
// 1e-6 per stats row. Each probability agrees to ~1e-5 relative, and a cell holds at least the 0.25 it started
// with; a bound of 1e-4 per row would hide a 15% error in a 1,500-entry decode, whose probabilities are ~7e-4.
void compare_attention(Backend& gpu, Backend& cpu, TwoPools& pools, int n_heads, const std::vector<SeqSpec>& specs,
                       const Tables& tables, std::mt19937& rng, const std::string& what) {
  const KvBlockLayout& L = pools.cpu_layout;
  const int64_t width = int64_t(n_heads) * L.head_dim;
  std::vector<AttentionSequence> cpu_seqs, gpu_seqs;
  std::vector<std::vector<float>> cpu_sums(specs.size()), gpu_sums(specs.size());
  int rows = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    AttentionSequence a{rows, specs[s].n_q, specs[s].n_ctx_before, tables.tables[s]};
    rows += specs[s].n_q;
    cpu_seqs.push_back(a);
    gpu_seqs.push_back(a);
    if (specs[s].stats_from >= 0) {
      const int stride = specs[s].n_ctx_before + specs[s].n_q + 3;  // wider than the entries, as the model's
      cpu_sums[s].assign(size_t(n_heads * stride), 0.25f);           // sums already hold earlier steps' values
      gpu_sums[s] = cpu_sums[s];
      for (auto* seqs : {&cpu_seqs, &gpu_seqs}) {
        (*seqs)[s].sums_stride = stride;
        (*seqs)[s].stats_row_begin = specs[s].stats_from;
      }
      cpu_seqs[s].column_sums = cpu_sums[s].data();
      gpu_seqs[s].column_sums = gpu_sums[s].data();
    }
  }
  std::vector<float> q = random_values(size_t(rows * width), rng, -1.5f, 1.5f);
  std::vector<float> want(q.size(), 0.0f);
  const float scale = 1.0f / std::sqrt(float(L.head_dim));
  Tensor cpu_out{want.data(), DType::f32, rows, width};
  cpu.paged_attention(Tensor{q.data(), DType::f32, rows, width}, cpu_seqs, pools.cpu, n_heads, scale, cpu_out);

  Tensor qd = gpu.alloc(rows, width, DType::f32), out = gpu.alloc(rows, width, DType::f32);
  gpu.copy_from_host(q.data(), qd);
  gpu.paged_attention(qd, gpu_seqs, pools.gpu, n_heads, scale, out);
  std::vector<float> got(q.size());
  gpu.copy_to_host(out, got.data());
  expect_near_all(got, want, 2e-5f, 1e-4f, what + ": attention output");
  for (size_t s = 0; s < specs.size(); ++s) {
    if (specs[s].stats_from < 0) continue;
    const float tol = 1e-6f * float(std::max(1, specs[s].n_q - specs[s].stats_from));
    expect_near_all(gpu_sums[s], cpu_sums[s], tol, 1e-4f, what + ": column sums of sequence " + std::to_string(s));
  }
  gpu.free(qd);
  gpu.free(out);
}

// The step's keys and values land in the same cells on both backends: exactly, since k and v are bf16 numbers.
TEST_F(CudaBackendTest, KvWriteStoresTheStepsEntriesAsBf16) {
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

TEST_F(CudaBackendTest, PagedAttentionSmolLm2ShapesDecodeAndPrefill) {
  // GQA 9/3, head_dim 64, blocks of 16: decodes at several context lengths (the first entry, mid-block, long),
  // prefill chunks from the start and after earlier entries, and a chunk of exactly one tile.
  TwoPools pools(KvBlockLayout{3, 64, 16, DType::f32, KvQuant::none}, 160);
  pools.fill(160, rng);
  const std::vector<SeqSpec> specs = {{1, 0, 0},  {1, 37},     {1, 1500, 0}, {45, 0, 10},
                                      {70, 100},  {32, 16, 31}, {3, 5}};
  compare_attention(*gpu, *cpu, pools, 9, specs, Tables(specs, 16, slot_ids(160), {}, rng), rng, "GQA 9/3, head_dim 64");
}

TEST_F(CudaBackendTest, PagedAttentionLlamaShapesDecodeAndPrefill) {
  // GQA 32/8, head_dim 128: a long decode (many splits) beside short ones and a prefill chunk with column sums.
  TwoPools pools(KvBlockLayout{8, 128, 16, DType::f32, KvQuant::none}, 240);
  pools.fill(240, rng);
  const std::vector<SeqSpec> specs = {{1, 3000}, {1, 63, 0}, {33, 17, 0}, {1, 16}};
  compare_attention(*gpu, *cpu, pools, 32, specs, Tables(specs, 16, slot_ids(240), {}, rng), rng, "GQA 32/8, head_dim 128");
}

TEST_F(CudaBackendTest, PagedAttentionGroupsBeyondOneDecodeBlock) {
  // GQA 40/2 (20 query heads per KV head, as Llama 3.1 405B has 16): a decode block holds 8 query heads, so each
  // KV head's decodes take three blocks, the last with 4 heads. Decodes short and long, a prefill with column sums.
  TwoPools pools(KvBlockLayout{2, 128, 16, DType::f32, KvQuant::none}, 120);
  pools.fill(120, rng);
  const std::vector<SeqSpec> specs = {{1, 1200, 0}, {1, 9}, {20, 30, 4}};
  compare_attention(*gpu, *cpu, pools, 40, specs, Tables(specs, 16, slot_ids(120), {}, rng), rng,
                    "GQA 40/2, head_dim 128");
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
  compare_attention(gpu, cpu, pools, n_heads, specs, Tables(specs, kKvQuantGroup, slot_ids(n_full), leading, rng), rng,
                    std::string(quant == KvQuant::int8 ? "int8" : "int4") + " pool, GQA " + std::to_string(n_heads) +
                        "/" + std::to_string(n_kv_heads));
}

TEST_F(CudaBackendTest, PagedAttentionReadsInt8Blocks) { quantized_attention(*gpu, *cpu, KvQuant::int8, 9, 3, 64, rng); }

TEST_F(CudaBackendTest, PagedAttentionReadsInt4Blocks) {
  quantized_attention(*gpu, *cpu, KvQuant::int4, 32, 8, 128, rng);
}

// SpindleKV pools: each table starts with coded blocks and continues in bf16 blocks. Both pools hold the same code
// rows and the same fp32 codebook vectors and both views the same key RoPE table, so a coded entry is the same
// fp32 numbers on both backends: its key to the bit (the same operations in the same order, no fused
// multiply-adds on either side), its value up to one rounding in another order (the CPU multiplies p by the
// magnitude first, the device the magnitude by the vector). That is within the fp32 reordering that
// compare_attention's bounds already allow, so they hold unchanged.
void coded_attention(Backend& gpu, Backend& cpu, int n_heads, int n_kv_heads, int head_dim, const RopeParams& rope,
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
  compare_attention(gpu, cpu, pools, n_heads, specs, Tables(specs, kBlockSize, full_slots, leading, rng), rng, what);
}

TEST_F(CudaBackendTest, PagedAttentionReadsCodedBlocksWithInterleavedRope) {
  // SmolLM2's shape and RoPE: GQA 9/3, head_dim 64, interleaved pairs.
  coded_attention(*gpu, *cpu, 9, 3, 64, RopeParams{RopeStyle::interleaved, 100000.0f, {}}, rng,
                  "coded blocks, GQA 9/3, head_dim 64, interleaved RoPE");
}

TEST_F(CudaBackendTest, PagedAttentionReadsCodedBlocksWithNeoxRope) {
  // GQA 32/8, head_dim 128, neox pairs (i, i + 64) and Llama 3.1's frequency scaling.
  const RopeParams llama31{RopeStyle::half_split, 500000.0f, RopeScaling{8.0f, 1.0f, 4.0f, 8192}};
  coded_attention(*gpu, *cpu, 32, 8, 128, llama31, rng, "coded blocks, GQA 32/8, head_dim 128, neox RoPE");
}

// A coded key cannot be read without the pool's key RoPE table; with one, ids past the pool's coded blocks are
// still refused.
TEST_F(CudaBackendTest, PagedAttentionNeedsAKeyRopeTableForCodedBlocks) {
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

// ---- SmolLM2-135M end to end ---------------------------------------------------------------------------------

// The same weights on both backends (the CUDA one rounds them to bf16), a 40-token prompt prefilled at once, then
// 8 decode steps fed the CPU's greedy tokens. bf16 weights and GEMM inputs perturb every layer by ~2^-9
// relative; over 30 layers the logits (spread over ~±20) move by a few hundredths typically. Checked: the largest
// logit difference per position below 1.0, the mean below 0.1, and the same argmax wherever the CPU's top-2
// margin exceeds 1.0 (twice the per-logit bound: a flip there would need an error past it).
TEST_F(CudaBackendTest, SmolLm2LogitsMatchTheCpuBackend) {
  auto gguf = GgufFile::open(test::smollm2_gguf_path());
  const ModelWeights weights = load_gguf_weights(gguf, ShardSpec{});
  LlamaModel cpu_model(*cpu, weights), gpu_model(*gpu, weights);
  // 30 layers x 3 blocks of 16 for 48 entries, and spare.
  BlockPool cpu_pool(*cpu, cpu_model.kv_layout(16), 128), gpu_pool(*gpu, gpu_model.kv_layout(16), 128);
  const int n_layers = cpu_model.config().n_layers;
  KvCache cpu_cache(cpu_pool, 0, n_layers), gpu_cache(gpu_pool, 0, n_layers);
  const int64_t vocab = cpu_model.config().vocab_size;

  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 17) % 20000);
  std::vector<float> cpu_logits, gpu_logits;
  auto compare = [&](const std::string& what) {
    ASSERT_EQ(cpu_logits.size(), gpu_logits.size()) << what;
    const size_t n_rows = cpu_logits.size() / size_t(vocab);
    for (size_t r = 0; r < n_rows; ++r) {
      const float* c = cpu_logits.data() + r * vocab;
      const float* g = gpu_logits.data() + r * vocab;
      float max_diff = 0.0f, sum_diff = 0.0f;
      for (int64_t i = 0; i < vocab; ++i) {
        max_diff = std::max(max_diff, std::fabs(c[i] - g[i]));
        sum_diff += std::fabs(c[i] - g[i]);
      }
      EXPECT_LT(max_diff, 1.0f) << what << " row " << r;
      EXPECT_LT(sum_diff / float(vocab), 0.1f) << what << " row " << r;
      const int64_t best = std::max_element(c, c + vocab) - c;
      float second = -INFINITY;
      for (int64_t i = 0; i < vocab; ++i) {
        if (i != best) second = std::max(second, c[i]);
      }
      if (c[best] - second > 1.0f) {
        EXPECT_EQ(std::max_element(g, g + vocab) - g, best) << what << " row " << r;
      }
    }
  };

  const BatchSequence prefill{1, prompt, 0, LogitsMode::all};
  cpu_model.forward({&prefill, 1}, cpu_cache, cpu_logits);
  gpu_model.forward({&prefill, 1}, gpu_cache, gpu_logits);
  compare("prefill");
  int32_t token = int32_t(std::max_element(cpu_logits.end() - vocab, cpu_logits.end()) - (cpu_logits.end() - vocab));
  for (int step = 0; step < 8; ++step) {
    const BatchSequence decode{1, {&token, 1}, 40 + step, LogitsMode::last};
    cpu_model.forward({&decode, 1}, cpu_cache, cpu_logits);
    gpu_model.forward({&decode, 1}, gpu_cache, gpu_logits);
    compare("decode step " + std::to_string(step));
    token = int32_t(std::max_element(cpu_logits.begin(), cpu_logits.end()) - cpu_logits.begin());
  }
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
