// The CPU backend: fp32 activations, memory in mappings of its own (huge pages where large:
// kernels/cpu/host_memory.h), weights in fp32 where the loader put them or in their quantized blocks
// (kernels/cpu/packed_weight.h), repacked ones side by side in an arena.
#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/kv_codebook_ops.h"
#include "kernels/cpu/kv_key_forms.h"
#include "kernels/cpu/kv_merge_ops.h"
#include "kernels/cpu/packed_weight.h"
#include "kernels/cpu/pod_ops.h"
#include "kernels/cpu/quantized_matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace strata {
namespace {

void require_f32(const Tensor& t, const char* what) {
  if (t.dtype != DType::f32) throw std::invalid_argument(std::string("cpu backend: ") + what + " must be f32");
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ActivationDtype activations) : activations_(activations) {}
  std::string name() const override { return "cpu"; }
  DType kv_dtype() const override { return DType::f32; }
  int64_t uploaded_weight_bytes(const WeightMatrix& w) const override {
    return cpu::packed_weight_bytes(w, pair_packing(w.format));
  }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override {
    // Zeroed and page-aligned (whole cache lines for BLAS and the vectorised loops), with 64 bytes of slack.
    cpu::HostMapping memory(size_t(rows * cols * dtype_bytes(dtype)) + 64);
    void* p = memory.data();
    owned_.emplace(p, std::move(memory));
    return Tensor{p, dtype, rows, cols};
  }

  void free(Tensor& t) override {
    owned_.erase(t.data);
    t = Tensor{};
  }

  Tensor upload_weight(const WeightMatrix& w) override {
    if (w.format == WeightFormat::f32) return Tensor{const_cast<float*>(w.f32()), DType::f32, w.rows, w.cols};
    const cpu::PackedWeight* rows = nullptr;
    for (const Uploaded& u : uploaded_) {
      if ((rows = u.find_rows(w))) break;
    }
    if (rows == nullptr) {
      Uploaded& u = uploaded_.emplace_back();
      u.source = w;
      u.packed = std::make_unique<cpu::OwnedPackedWeight>(cpu::pack_weight(w, pair_packing(w.format), &weights_));
      rows = &u.packed->view;
    }
    return Tensor{const_cast<cpu::PackedWeight*>(rows), DType::packed, w.rows, w.cols};
  }

  void copy_to_host(const Tensor& src, float* dst) override {
    require_f32(src, "copy_to_host source");
    std::memcpy(dst, src.data, size_t(src.bytes()));
  }

  void copy_from_host(const float* src, Tensor& dst) override {
    require_f32(dst, "copy_from_host destination");
    std::memcpy(dst.data, src, size_t(dst.bytes()));
  }

  void embedding(std::span<const int32_t> ids, const Tensor& table, Tensor& out) override {
    if (table.dtype == DType::packed) {
      cpu::quantized_embedding(ids.data(), int64_t(ids.size()), packed(table), out.f32());
    } else {
      cpu::embedding(ids, table.f32(), table.cols, out.f32());
    }
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    cpu::rmsnorm(x.f32(), w.f32(), x.rows, x.cols, eps, out.f32());
  }
  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override {
    if (x.cols != w.cols || out.cols != w.rows || out.rows < x.rows) {
      throw std::invalid_argument("cpu backend: matmul shapes do not match");
    }
    if (w.dtype == DType::packed) {
      cpu::quantized_matmul(x.f32(), x.rows, packed(w), out.f32(), activations_);
    } else {
      cpu::matmul(x.f32(), w.f32(), x.rows, x.cols, w.rows, out.f32());
    }
  }
  void matmul_shared_input(const Tensor& x, std::span<const Tensor* const> w, std::span<Tensor* const> out) override {
    const bool all_packed = std::all_of(w.begin(), w.end(), [](const Tensor* t) { return t->dtype == DType::packed; });
    if (!all_packed || w.size() != out.size()) {
      Backend::matmul_shared_input(x, w, out);
      return;
    }
    std::vector<const cpu::PackedWeight*> weights;
    std::vector<float*> outputs;
    for (size_t i = 0; i < w.size(); ++i) {
      if (x.cols != w[i]->cols || out[i]->cols != w[i]->rows || out[i]->rows < x.rows) {
        throw std::invalid_argument("cpu backend: matmul shapes do not match");
      }
      weights.push_back(&packed(*w[i]));
      outputs.push_back(out[i]->f32());
    }
    cpu::quantized_matmul_shared_input(x.f32(), x.rows, weights, outputs, activations_);
  }
  void prefetch_weights(std::span<const Tensor* const> w) override {
    cpu::ThreadPool::ByteRange ranges[cpu::ThreadPool::kMaxReadAheadRanges];
    const size_t n = std::min(w.size(), std::size(ranges));
    for (size_t i = 0; i < n; ++i) {
      if (w[i]->dtype == DType::packed) {
        const cpu::PackedWeight& p = packed(*w[i]);
        ranges[i] = {p.data, p.rows * p.row_bytes};  // every layout's rows lie at data + row * row_bytes
      } else {
        ranges[i] = {static_cast<const uint8_t*>(w[i]->data), w[i]->bytes()};
      }
    }
    cpu::compute_pool().read_ahead(std::span(ranges, n));
  }
  void rope(Tensor& x, std::span<const int32_t> positions, int n_heads, int head_dim,
            const RopeParams& params) override {
    cpu::rope(x.f32(), positions, n_heads, head_dim, params);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    cpu::silu_mul(gate.f32(), up.f32(), gate.size(), out.f32());
  }
  void add(Tensor& x, const Tensor& y) override { cpu::add(x.f32(), y.f32(), x.size()); }
  void gather_rows(const Tensor& x, std::span<const int64_t> rows, Tensor& out) override {
    if (x.cols != out.cols || out.rows < int64_t(rows.size())) {
      throw std::invalid_argument("cpu backend: gather_rows shapes do not match");
    }
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(out.row(int64_t(i)), x.row(rows[i]), size_t(x.cols) * 4);
  }
  void sample_rows(Tensor& logits, std::span<const RowSampling> rows, std::span<RowSample> out) override {
    if (logits.rows != int64_t(rows.size()) || out.size() != rows.size() || logits.cols < 1) {
      throw std::invalid_argument("cpu backend: sample_rows needs one sampling and one output per row of logits");
    }
    // Every mask is checked before a row is touched, so that the error names its row.
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!rows[r].allowed.empty()) check_mask(rows[r].allowed, logits.cols, int64_t(r));
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      out[r] = sample_row_on_host({logits.row(int64_t(r)), size_t(logits.cols)}, rows[r]);
    }
  }
  void kv_write(const Tensor& k, const Tensor& v, std::span<const AttentionSequence> seqs,
                const KvPoolView& pool) override {
    cpu::kv_write(k.f32(), v.f32(), seqs, pool);
  }
  void paged_attention(const Tensor& q, std::span<const AttentionSequence> seqs, const KvPoolView& pool,
                       int n_heads, float scale, Tensor& out) override {
    cpu::paged_attention(q.f32(), seqs, pool, n_heads, scale, out.f32());
  }

  void kv_compact(std::span<const int32_t> block_table, std::span<const int32_t> kept, const KvPoolView& pool,
                  int head) override {
    cpu::kv_compact(block_table, kept, pool, head);
  }
  void kv_quantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) override {
    cpu::kv_quantize(src, dst, pool);
  }
  void kv_dequantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) override {
    cpu::kv_dequantize(src, dst, pool);
  }

  void kv_nearest_keys(std::span<const int32_t> block_table, int head, std::span<const int32_t> queries,
                       std::span<const int32_t> candidates, const KvPoolView& pool, std::span<float> best_similarity,
                       std::span<int32_t> best_candidate) override {
    cpu::kv_nearest_keys(block_table, head, queries, candidates, pool, best_similarity, best_candidate);
  }
  void kv_merge(std::span<const int32_t> block_table, const KvMerges& merges, const KvPoolView& pool,
                int head) override {
    cpu::kv_merge(block_table, merges, pool, head);
  }
  bool has_kv_key_forms() const override { return true; }
  bool has_column_maxima() const override { return true; }
  void kv_key_forms(std::span<const int32_t> block_table, int head, std::span<const float> linear,
                    std::span<const float> quadratic, const KvPoolView& pool, std::span<float> forms,
                    std::span<float> value_norms) override {
    cpu::kv_key_forms(block_table, head, linear, quadratic, pool, forms, value_norms);
  }
  int kv_codebook_build(std::span<const int32_t> block_table, int head, KvPart part,
                        std::span<const int32_t> positions, float threshold, const KvPoolView& pool,
                        std::span<int32_t> assignment, std::span<int32_t> centres) override {
    return cpu::kv_codebook_build(block_table, head, part, positions, threshold, pool, assignment, centres);
  }
  void kv_codebook_match(std::span<const int32_t> block_table, int head, KvPart part, std::span<const int32_t> entries,
                         std::span<const int32_t> positions, std::span<const int32_t> codebook, const KvPoolView& pool,
                         std::span<float> best_similarity, std::span<int32_t> best_index) override {
    cpu::kv_codebook_match(block_table, head, part, entries, positions, codebook, pool, best_similarity, best_index);
  }
  void kv_codebook_encode(std::span<const int32_t> block_table, const KvCodebookEncoding& encoding,
                          const KvPoolView& pool) override {
    cpu::kv_codebook_encode(block_table, encoding, pool);
  }
  void pod_attention(const Tensor& q, std::span<const AttentionSequence> seqs, std::span<const PodDistant> distant,
                     const KvPoolView& pool, int n_heads, float scale, const PodWindow& window, Tensor& out) override {
    cpu::pod_attention(q.f32(), seqs, distant, pool, n_heads, scale, window, out.f32());
  }
  void kv_pair_values(std::span<const int32_t> first, std::span<const int32_t> second,
                      const KvPoolView& pool) override {
    cpu::kv_pair_values(first, second, pool);
  }

 private:
  // A packed upload and the host matrix it came from; views of row ranges of it (a vocabulary-parallel slice of a
  // tied head) are made on demand and kept with it.
  struct Uploaded {
    WeightMatrix source;
    std::unique_ptr<cpu::OwnedPackedWeight> packed;
    mutable std::vector<std::unique_ptr<cpu::PackedWeight>> row_views;

    // The packed rows of `w` if w is this source or a range of its rows; nullptr otherwise.
    const cpu::PackedWeight* find_rows(const WeightMatrix& w) const {
      if (w.format != source.format || w.cols != source.cols) return nullptr;
      const auto* first = static_cast<const uint8_t*>(w.data);
      const auto* begin = static_cast<const uint8_t*>(source.data);
      const int64_t offset = first - begin, row_bytes = source.row_bytes();
      if (first < begin || offset % row_bytes != 0 || offset / row_bytes + w.rows > source.rows) return nullptr;
      if (offset == 0 && w.rows == source.rows) return &packed->view;
      // a range of 16-row tiles must start and end at a tile's edge (else it is packed on its own)
      const int64_t tile = cpu::is_rows16(packed->view.layout) ? cpu::kTileRows16 : 1;
      if ((offset / row_bytes) % tile != 0 || w.rows % tile != 0) return nullptr;
      cpu::PackedWeight rows = packed->view;
      rows.data += offset / row_bytes * rows.row_bytes;
      rows.rows = w.rows;
      return row_views.emplace_back(std::make_unique<cpu::PackedWeight>(rows)).get();
    }
  };

  static const cpu::PackedWeight& packed(const Tensor& t) { return *static_cast<const cpu::PackedWeight*>(t.data); }

  // Integer activations read the 32-value formats and the k-quants as 16-row tiles on an AVX-512 VNNI machine
  // (kernels/cpu/quantized_dot_avx512_vnni.cpp, and quantized_dot_amx.cpp with AMX), and all but those held as
  // 8-bit values (Q8_0, Q5_1) on an x86-64-v3 one (AVX2, quantized_dot_avx2_tiles.cpp, where Q8_0's pairs are
  // faster); everything else as pairs.
  cpu::PairPacking pair_packing(WeightFormat format) const {
    const cpu::CpuIsa isa = cpu::best_cpu_isa();
    const bool tiles =
        isa >= cpu::CpuIsa::avx512_vnni || (isa != cpu::CpuIsa::baseline && !cpu::held_as_u8(format));
    return activations_ != ActivationDtype::f32 && tiles ? cpu::PairPacking::rows16 : cpu::PairPacking::pairs;
  }

  const ActivationDtype activations_;
  std::unordered_map<void*, cpu::HostMapping> owned_;  // alloc'd tensors, by their data
  cpu::HostArena weights_;                             // the repacked weights' values
  std::vector<Uploaded> uploaded_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(ActivationDtype activations) {
  return std::make_unique<CpuBackend>(activations);
}

}  // namespace strata
