#pragma once
// The ops behind every step of the model, with one implementation per device: the CPU (fp32 activations, the
// reference; weights in fp32 with BLAS, or kept in their quantized blocks with integer kernels) and CUDA (bf16
// storage, fp32 accumulation). Every op of the CUDA backend has a test file named like its kernel
// (tests/kernels/cuda/), against a plain double-precision reference where one is short to write (attention,
// matmul, the row-wise ops) and against its CPU twin otherwise.
//
// Shapes in the comments: T = tokens in the step, D = d_model, H = query heads, Hkv = KV heads, Dh = head dim.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "kernels/column_maxima.h"
#include "kernels/kv_block_layout.h"
#include "kernels/kv_codebook.h"
#include "kernels/kv_merge.h"
#include "kernels/pod_attention.h"
#include "kernels/rope_params.h"
#include "kernels/tensor.h"
#include "kernels/token_sampling.h"
#include "kernels/weight_format.h"

namespace strata {

// One sequence's part of an attention call in one layer. Block tables and statistics are host memory on every
// backend: a device backend uploads the tables and adds its device-side sums into column_sums.
struct AttentionSequence {
  int q_begin = 0;                       // first row of q/out belonging to this sequence
  int n_q = 0;                           // rows (new tokens) of this sequence in the step
  int n_ctx_before = 0;                  // cache entries of this layer before the step's tokens
  std::span<const int32_t> block_table;  // blocks of this (sequence, layer), in entry order
  // Attention statistics for compression policies (host memory on every backend): when column_sums is set, the softmax probabilities of query
  // rows >= stats_row_begin are added to column_sums[h * sums_stride + e] for every query head h and entry e.
  float* column_sums = nullptr;
  int sums_stride = 0;
  int stats_row_begin = 0;
  // KVzip's statistic instead of the sum (only where Backend::has_column_maxima): column_sums keeps, for every
  // entry in [0, sinks) and [from, n), the largest of the rows' probabilities renormalized over those entries.
  std::optional<ColumnMaxima> column_maxima{};
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Element type of the KV pool's full-precision blocks: f32 on the CPU, bf16 on CUDA (kernels/kv_block_layout.h).
  // kv_cache.dtype f16 | bf16 makes the CPU's 16-bit instead (daemon/runtime.h, kv_pool_layout; every CPU KV op
  // reads and writes them through kernels/cpu/kv_rows.h).
  virtual DType kv_dtype() const = 0;
  // Bytes upload_weight(w) keeps of w on the device, which is what a step reads of it: the CPU keeps f32 and
  // quantized blocks as they come (kernels/cpu/packed_weight.h), CUDA stores bf16.
  virtual int64_t uploaded_weight_bytes(const WeightMatrix& w) const = 0;

  // Memory. alloc'd tensors live until the backend is destroyed or free() is called.
  virtual Tensor alloc(int64_t rows, int64_t cols, DType dtype) = 0;
  virtual void free(Tensor& t) = 0;
  // Makes a host weight matrix available to the device once. The CPU backend uses f32 matrices and the blocks of
  // Q4_K, Q5_K and Q6_K in place (the memory must outlive the backend) and repacks the other formats; a matrix, or a
  // range of its rows, uploaded again shares what the first upload made (a tied output head). CUDA converts every
  // format to bf16. The result is f32, or DType::packed for the weight of matmul and embedding.
  virtual Tensor upload_weight(const WeightMatrix& w) = 0;
  virtual void copy_to_host(const Tensor& src, float* dst) = 0;
  virtual void copy_from_host(const float* src, Tensor& dst) = 0;

  // out[t] = table[ids[t]]                                          table [V, D], out [T, D]
  virtual void embedding(std::span<const int32_t> ids, const Tensor& table, Tensor& out) = 0;
  // out = x / sqrt(mean(x^2) + eps) * w                             x, out [T, D], w [1, D]
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;
  // out = x * w^T                                                   x [T, in], w [out, in], out [T, out]
  virtual void matmul(const Tensor& x, const Tensor& w, Tensor& out) = 0;
  // out[i] = x * w[i]^T for weights that share their input (the Q, K and V projections; gate and up): one op, so
  // that a backend can spread them over its threads together. By default, one matmul each.
  virtual void matmul_shared_input(const Tensor& x, std::span<const Tensor* const> w, std::span<Tensor* const> out) {
    for (size_t i = 0; i < w.size(); ++i) matmul(x, *w[i], *out[i]);
  }
  // A hint: the next matmul (or matmul_shared_input) reads w, and the ops before it do not; a backend may start
  // reading w into its caches meanwhile (the CPU backend's idle threads do). By default nothing.
  virtual void prefetch_weights(std::span<const Tensor* const> w) { (void)w; }
  // Rotates every head of x in place, token t at positions[t].     x [T, n_heads * Dh]
  virtual void rope(Tensor& x, std::span<const int32_t> positions, int n_heads, int head_dim,
                    const RopeParams& params) = 0;
  // out = silu(gate) * up                                           [T, F]
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // x += y                                                          [T, D]
  virtual void add(Tensor& x, const Tensor& y) = 0;
  // out[i] = x[rows[i]]: the rows that need logits, gathered for the output head.   x [T, D], out [rows, D]
  virtual void gather_rows(const Tensor& x, std::span<const int64_t> rows, Tensor& out) = 0;
  // Chooses a token from each row of logits by rows[r] (the rule of kernels/token_sampling.h) where the logits
  // are: only the tokens and their logprobs come to the host (out, one per row). The masks and the penalties are
  // applied to `logits` in place.                                   logits [rows.size(), V]
  virtual void sample_rows(Tensor& logits, std::span<const RowSampling> rows, std::span<RowSample> out) = 0;

  // Writes the step's keys and values into the cache: token row q_begin + i of a sequence goes to entry
  // n_ctx_before + i of its block table, which is always a full-precision block.   k, v [T, Hkv * Dh]
  virtual void kv_write(const Tensor& k, const Tensor& v, std::span<const AttentionSequence> seqs,
                        const KvPoolView& pool) = 0;
  // Causal attention over the paged cache: query row q_begin + i of a sequence attends to its entries
  // [0, n_ctx_before + i]. Serves prefill chunks and decode steps alike. Quantized blocks are dequantized as they
  // are read, so the output and the column sums cover any mix of block formats. q, out [T, H * Dh]
  virtual void paged_attention(const Tensor& q, std::span<const AttentionSequence> seqs, const KvPoolView& pool,
                               int n_heads, float scale, Tensor& out) = 0;
  // Compaction after a policy's selection: entry kept[j] of the block table moves to entry j (kept ascending,
  // so every move goes towards the front and never overwrites an entry still to be read), in KV head `head`, or
  // in every KV head when head < 0. A table that starts with quantized blocks keeps the first
  // compacted_quantized_blocks() of them (kernels/kv_block_layout.h) and needs full-precision blocks after them
  // for the remaining kept entries. Values keep their codes and scales wherever they stay quantized; a key group
  // whose entries change is dequantized and quantized again (its error adds up over repeated compactions).
  virtual void kv_compact(std::span<const int32_t> block_table, std::span<const int32_t> kept,
                          const KvPoolView& pool, int head) = 0;
  // Seals KV groups (kv_cache.dtype int8 | int4 | int2): the 32 entries of full-precision block src[i] are
  // quantized into quantized block dst[i] (keys per channel, values per token; kernels/kv_block_layout.h). Every KV
  // head.
  virtual void kv_quantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) = 0;
  // The inverse: quantized block src[i] is written, dequantized, into full-precision block dst[i].
  virtual void kv_dequantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) = 0;

  // D2O's nearest-neighbour search on keys: for each entry queries[i] of KV head `head`, the highest cosine
  // similarity with the keys of `candidates` (best_similarity[i]) and which candidate gives it (best_candidate[i],
  // an index into candidates; the lower index on ties). Norms are clamped to 1e-8 (torch's cosine_similarity).
  // Outputs are host arrays of queries.size(): a few floats per evicted entry, never the keys themselves.
  virtual void kv_nearest_keys(std::span<const int32_t> block_table, int head, std::span<const int32_t> queries,
                               std::span<const int32_t> candidates, const KvPoolView& pool,
                               std::span<float> best_similarity, std::span<int32_t> best_candidate) = 0;
  // Expected Attention's reads of the cache (cache/policies/expected_attention_policy.cpp): for the first
  // n = value_norms.size() entries e of KV head `head`, m = linear.size() / head_dim quadratic forms of its key,
  // forms[j * n + e] = linear[j] . k_e + k_e^T quadratic[j] k_e (linear [m][Dh], quadratic [m][Dh][Dh], row-major),
  // and value_norms[e] = |v_e|. Quantized blocks are dequantized as they are read. Host outputs: m + 1 numbers per
  // entry, never the keys. Only where has_kv_key_forms(); the default throws std::logic_error.
  virtual bool has_kv_key_forms() const { return false; }
  // Whether paged_attention takes AttentionSequence::column_maxima (KVzip's scores; the CPU's only, so far).
  virtual bool has_column_maxima() const { return false; }
  virtual void kv_key_forms(std::span<const int32_t> /*block_table*/, int /*head*/, std::span<const float> /*linear*/,
                            std::span<const float> /*quadratic*/, const KvPoolView& /*pool*/,
                            std::span<float> /*forms*/, std::span<float> /*value_norms*/) {
    throw std::logic_error(name() + " backend: no kv_key_forms");
  }
  // Applies `merges` (kernels/kv_merge.h) to the keys and values of KV head `head`, in place.
  virtual void kv_merge(std::span<const int32_t> block_table, const KvMerges& merges, const KvPoolView& pool,
                        int head) = 0;

  // SpindleKV's codebooks (kernels/kv_codebook.h). Keys are read before RoPE: un-rotated from positions[i] with the
  // pool's key RoPE table. Cosines in fp32; a zero vector has the unit vector 0.
  // Algorithm 1 over entries [0, positions.size()) of KV head `head` (all in full-precision blocks): the greedy
  // codebook with edges cos > threshold (every entry adjacent to itself), the entry of highest remaining degree
  // first (the lower index on ties). Writes assignment[i] (the codebook index of entry i) and centres[c] (the
  // entry whose unit vector is codebook vector c), and returns the codebook's size. Host outputs of
  // positions.size(): indices only, never vectors.
  virtual int kv_codebook_build(std::span<const int32_t> block_table, int head, KvPart part,
                                std::span<const int32_t> positions, float threshold, const KvPoolView& pool,
                                std::span<int32_t> assignment, std::span<int32_t> centres) = 0;
  // For each entry entries[i] (at positions[i]) of KV head `head`: the highest cosine with the codebook vectors
  // `codebook` (vector ids) and the index into codebook that gives it, the lower on ties (-inf and -1 for an
  // empty codebook).
  virtual void kv_codebook_match(std::span<const int32_t> block_table, int head, KvPart part,
                                 std::span<const int32_t> entries, std::span<const int32_t> positions,
                                 std::span<const int32_t> codebook, const KvPoolView& pool,
                                 std::span<float> best_similarity, std::span<int32_t> best_index) = 0;
  // Writes one KV head's coded entries and new codebook vectors (KvCodebookEncoding).
  virtual void kv_codebook_encode(std::span<const int32_t> block_table, const KvCodebookEncoding& encoding,
                                  const KvPoolView& pool) = 0;

  // PoD (kernels/pod_attention.h): attention of each sequence's rows over its own proximal entries and, through
  // distant[s] (the block leader's queries and keys per KV head), its distant ones, over its own values, merged by
  // the gate. Values of paired blocks are read from their key region. q, out [T, H * Dh]
  virtual void pod_attention(const Tensor& q, std::span<const AttentionSequence> seqs,
                             std::span<const PodDistant> distant, const KvPoolView& pool, int n_heads, float scale,
                             const PodWindow& window, Tensor& out) = 0;
  // PoD storage: the value region of block second[i] is copied into the key region of block first[i].
  virtual void kv_pair_values(std::span<const int32_t> first, std::span<const int32_t> second,
                              const KvPoolView& pool) = 0;
};

// What the CPU backend's quantized matmuls multiply the weights with (engine.activation_dtype): the fp32
// activations as they are, or rounded to int8 or int16 per block of 32 for integer dot products
// (kernels/cpu/integer_activations.h, kernels/cpu/quantized_matmul.h).
enum class ActivationDtype : uint8_t { f32, int8, int16 };

std::unique_ptr<Backend> make_cpu_backend(ActivationDtype activations = ActivationDtype::f32);

}  // namespace strata
