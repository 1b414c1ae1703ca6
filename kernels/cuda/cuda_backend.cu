// The CUDA backend: bf16 weights and KV blocks, fp32 activations, accumulation and softmax. Each method starts one
// op of the context (kernels/cuda/cuda_context.h) and queues its kernels on the backend's one stream; only the
// methods that return host data (copy_to_host, and the statistics and searches with host outputs) wait for it.
// The ops themselves are kernels/cuda/cuda_ops.h's.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"

namespace strata {
namespace {

void require_f32(const Tensor& t, const char* what) {
  if (t.dtype != DType::f32) throw std::invalid_argument(std::string("cuda backend: ") + what + " must be f32");
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, bool overlap_launches) : ctx_(device, overlap_launches) {}

  ~CudaBackend() override {
    cudaSetDevice(ctx_.device());
    cudaStreamSynchronize(ctx_.stream());
    for (auto& [p, bytes] : owned_) cudaFree(p);
  }

  cuda::CudaContext& context() { return ctx_; }

  std::string name() const override { return "cuda"; }
  DType kv_dtype() const override { return DType::bf16; }
  int64_t uploaded_weight_bytes(const WeightMatrix& w) const override { return w.size() * 2; }

  // Zeroed device memory. The memset is queued on the stream, so every later op sees zeros.
  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override {
    ctx_.begin_op();
    const size_t bytes = size_t(rows * cols * dtype_bytes(dtype));
    void* p = nullptr;
    cuda::check(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc (alloc)");
    cuda::check(cudaMemsetAsync(p, 0, bytes, ctx_.stream()), "cudaMemsetAsync (alloc)");
    owned_[p] = bytes;
    return Tensor{p, dtype, rows, cols};
  }

  void free(Tensor& t) override {
    auto it = owned_.find(t.data);
    if (it != owned_.end()) {
      ctx_.begin_op();
      // Kernels still queued may read the tensor: let them finish first (free is rare: workspace growth).
      cuda::check(cudaStreamSynchronize(ctx_.stream()), "cudaStreamSynchronize (free)");
      cuda::check(cudaFree(t.data), "cudaFree");
      owned_.erase(it);
    }
    t = Tensor{};
  }

  // Host weights -> device bf16, whole rows of about kChunk floats at a time through a device fp32 buffer, cast by
  // a kernel. Quantized rows are dequantized on the host first.
  Tensor upload_weight(const WeightMatrix& m) override {
    Tensor w = alloc(m.rows, m.cols, DType::bf16);
    constexpr int64_t kChunk = int64_t(1) << 22;  // 16 MiB of fp32
    const int64_t rows_per_chunk = std::max<int64_t>(1, kChunk / std::max<int64_t>(1, m.cols));
    const int64_t chunk_floats = std::min(m.rows, rows_per_chunk) * m.cols;
    auto* staging = static_cast<float*>(ctx_.scratch(size_t(chunk_floats) * sizeof(float)));
    std::vector<float> host(m.format == WeightFormat::f32 ? 0 : size_t(chunk_floats));
    for (int64_t row = 0; row < m.rows; row += rows_per_chunk) {
      const int64_t n_rows = std::min(rows_per_chunk, m.rows - row), len = n_rows * m.cols;
      const float* src = m.format == WeightFormat::f32 ? m.f32() + row * m.cols : host.data();
      for (int64_t r = 0; m.format != WeightFormat::f32 && r < n_rows; ++r) {
        dequantize_weight_row(m.format, m.row(row + r), host.data() + r * m.cols, m.cols);
      }
      // From pageable memory the copy has taken `src` once it returns, so `host` may be refilled.
      cuda::check(cudaMemcpyAsync(staging, src, size_t(len) * sizeof(float), cudaMemcpyHostToDevice, ctx_.stream()),
                  "cudaMemcpyAsync (upload_weight)");
      cuda::f32_to_bf16(ctx_, staging, static_cast<__nv_bfloat16*>(w.data) + row * m.cols, len);
    }
    // The caller may release the host matrix once this returns.
    cuda::check(cudaStreamSynchronize(ctx_.stream()), "cudaStreamSynchronize (upload_weight)");
    return w;
  }

  void copy_to_host(const Tensor& src, float* dst) override {
    require_f32(src, "copy_to_host source");
    ctx_.begin_op();
    ctx_.download(src.data, dst, size_t(src.bytes()));
  }

  // Through the context's pinned staging, so the copy is queued without waiting and the caller may reuse `src`.
  void copy_from_host(const float* src, Tensor& dst) override {
    require_f32(dst, "copy_from_host destination");
    ctx_.begin_op();
    const float* staged = ctx_.upload(std::span<const float>(src, size_t(dst.size())));
    cuda::check(cudaMemcpyAsync(dst.data, staged, size_t(dst.bytes()), cudaMemcpyDeviceToDevice, ctx_.stream()),
                "cudaMemcpyAsync (copy_from_host)");
  }

  void embedding(std::span<const int32_t> ids, const Tensor& table, Tensor& out) override {
    ctx_.begin_op();
    cuda::embedding(ctx_, ids, table, out);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    ctx_.begin_op();
    cuda::rmsnorm(ctx_, x, w, eps, out);
  }
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override {
    ctx_.begin_op();
    cuda::matmul(ctx_, x, w, out);
  }
  void matmul_shared_input(const Tensor& x, std::span<const Tensor* const> w, std::span<Tensor* const> out) override {
    ctx_.begin_op();
    cuda::matmul_shared_input(ctx_, x, w, out);
  }
  void rope(Tensor& x, std::span<const int32_t> positions, int n_heads, int head_dim,
            const RopeParams& params) override {
    ctx_.begin_op();
    cuda::rope(ctx_, x, positions, n_heads, head_dim, params);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    ctx_.begin_op();
    cuda::silu_mul(ctx_, gate, up, out);
  }
  void add(Tensor& x, const Tensor& y) override {
    ctx_.begin_op();
    cuda::add(ctx_, x, y);
  }
  void gather_rows(const Tensor& x, std::span<const int64_t> rows, Tensor& out) override {
    ctx_.begin_op();
    cuda::gather_rows(ctx_, x, rows, out);
  }
  void sample_rows(Tensor& logits, std::span<const RowSampling> rows, std::span<RowSample> out) override {
    ctx_.begin_op();
    cuda::sample_rows(ctx_, logits, rows, out);
  }

  void kv_write(const Tensor& k, const Tensor& v, std::span<const AttentionSequence> seqs,
                const KvPoolView& pool) override {
    ctx_.begin_op();
    cuda::kv_write(ctx_, k, v, seqs, pool);
  }
  void paged_attention(const Tensor& q, std::span<const AttentionSequence> seqs, const KvPoolView& pool,
                       int n_heads, float scale, Tensor& out) override {
    ctx_.begin_op();
    cuda::paged_attention(ctx_, q, seqs, pool, n_heads, scale, out);
  }

  void kv_compact(std::span<const int32_t> block_table, std::span<const int32_t> kept, const KvPoolView& pool,
                  int head) override {
    ctx_.begin_op();
    cuda::kv_compact(ctx_, block_table, kept, pool, head);
  }
  void kv_quantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) override {
    ctx_.begin_op();
    cuda::kv_quantize(ctx_, src, dst, pool);
  }
  void kv_dequantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) override {
    ctx_.begin_op();
    cuda::kv_dequantize(ctx_, src, dst, pool);
  }
  void kv_nearest_keys(std::span<const int32_t> block_table, int head, std::span<const int32_t> queries,
                       std::span<const int32_t> candidates, const KvPoolView& pool, std::span<float> best_similarity,
                       std::span<int32_t> best_candidate) override {
    ctx_.begin_op();
    cuda::kv_nearest_keys(ctx_, block_table, head, queries, candidates, pool, best_similarity, best_candidate);
  }
  void kv_merge(std::span<const int32_t> block_table, const KvMerges& merges, const KvPoolView& pool,
                int head) override {
    ctx_.begin_op();
    cuda::kv_merge(ctx_, block_table, merges, pool, head);
  }
  bool has_kv_key_forms() const override { return true; }
  void kv_key_forms(std::span<const int32_t> block_table, int head, std::span<const float> linear,
                    std::span<const float> quadratic, const KvPoolView& pool, std::span<float> forms,
                    std::span<float> value_norms) override {
    ctx_.begin_op();
    cuda::kv_key_forms(ctx_, block_table, head, linear, quadratic, pool, forms, value_norms);
  }
  int kv_codebook_build(std::span<const int32_t> block_table, int head, KvPart part,
                        std::span<const int32_t> positions, float threshold, const KvPoolView& pool,
                        std::span<int32_t> assignment, std::span<int32_t> centres) override {
    ctx_.begin_op();
    return cuda::kv_codebook_build(ctx_, block_table, head, part, positions, threshold, pool, assignment, centres);
  }
  void kv_codebook_match(std::span<const int32_t> block_table, int head, KvPart part,
                         std::span<const int32_t> entries, std::span<const int32_t> positions,
                         std::span<const int32_t> codebook, const KvPoolView& pool, std::span<float> best_similarity,
                         std::span<int32_t> best_index) override {
    ctx_.begin_op();
    cuda::kv_codebook_match(ctx_, block_table, head, part, entries, positions, codebook, pool, best_similarity,
                            best_index);
  }
  void kv_codebook_encode(std::span<const int32_t> block_table, const KvCodebookEncoding& encoding,
                          const KvPoolView& pool) override {
    ctx_.begin_op();
    cuda::kv_codebook_encode(ctx_, block_table, encoding, pool);
  }
  void pod_attention(const Tensor& q, std::span<const AttentionSequence> seqs, std::span<const PodDistant> distant,
                     const KvPoolView& pool, int n_heads, float scale, const PodWindow& window,
                     Tensor& out) override {
    ctx_.begin_op();
    cuda::pod_attention(ctx_, q, seqs, distant, pool, n_heads, scale, window, out);
  }
  void kv_pair_values(std::span<const int32_t> first, std::span<const int32_t> second,
                      const KvPoolView& pool) override {
    ctx_.begin_op();
    cuda::kv_pair_values(ctx_, first, second, pool);
  }

 private:
  cuda::CudaContext ctx_;
  std::unordered_map<void*, size_t> owned_;  // alloc'd tensors and their sizes
};

// cudaGetDeviceCount's answer; its error, if any, is cleared so that it does not surface in a later call.
cudaError_t count_devices(int& n) {
  n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  return e;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  count_devices(n);
  return n;
}

// Empty when a device is present.
std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = count_devices(n);
  if (e != cudaSuccess) return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device is present";
  return "";
}

std::unique_ptr<Backend> make_cuda_backend(int device, bool overlap_launches) {
  const int n = cuda_device_count();
  const std::string name = "cuda device " + std::to_string(device);
  if (device < 0 || device >= n) {
    throw std::runtime_error(name + ": " +
                             (n == 0 ? cuda_unavailable_reason() : std::to_string(n) + " device(s) are present"));
  }
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  if (prop.major < 8) {
    throw std::runtime_error(name + " (" + prop.name + "): compute capability " + std::to_string(prop.major) + "." +
                             std::to_string(prop.minor) + "; the CUDA backend needs 8.0 or later (bf16)");
  }
  try {
    return std::make_unique<CudaBackend>(device, overlap_launches);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(name + " (" + prop.name + "): " + e.what());
  }
}

void* cuda_stream(Backend& backend) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  if (cuda_backend == nullptr) {
    throw std::invalid_argument("cuda_stream: the " + backend.name() + " backend is not a CUDA backend");
  }
  return cuda_backend->context().stream();
}

}  // namespace strata
