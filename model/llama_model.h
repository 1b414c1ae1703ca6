#pragma once
// The Llama forward pass of one rank's shard over the paged KV cache: batched prefill chunks and decode steps of
// several sequences of different lengths in one call, all tokens flattened into one [T, D] activation matrix.
//   embed (first stage) | hidden states from the previous stage
//   -> for each layer: rmsnorm -> q,k,v -> rope -> write k,v to the cache -> paged attention -> o (+x)
//                      -> rmsnorm -> silu(gate) * up -> down (+x)
//   -> hidden states to the next stage | final rmsnorm -> output head (last stage), only for the rows that need
//      logits.
// Tensor parallelism (docs/distributed.md): q, k, v, gate and up are column-parallel (this rank's heads and MLP
// slice), o and down row-parallel, each followed by an all-reduce of its [T, D] output over the TP group; the
// output head is vocabulary-parallel and its slices are all-gathered, so every TP rank of the last stage holds
// the full logits and samples the same token.
// Pipeline micro-batches (set_micro_batches): a step's tokens are cut into pieces that go through the stage one
// after another, each sent on as soon as it is done, so that stage s works on piece m while stage s+1 works on
// piece m-1 (docs/distributed.md).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/query_moments.h"
#include "kernels/backend.h"
#include "model/model_weights.h"
#include "parallel/comm.h"
#include "parallel/device_comm.h"

namespace strata {

// Which rows of a sequence's step leave through the output head: none; the last one's logits; every row's logits;
// or only a token chosen from the last row (the row is sampled where the logits are, Backend::sample_rows, and no
// vocabulary-sized row is copied to the host).
enum class LogitsMode { none, last, all, sample };

// Column sums of attention probabilities that a sequence's compression policies asked for (PolicyNeeds): for
// every local layer, query head h and cache entry e, sums[layer][h * stride + e] += p(row, e) over the query
// rows at positions >= rows_from[layer]. Kept by the caller across the steps it spans (a chunked prefill).
struct AttentionStats {
  int stride = 0;                         // entries per head row: at least the entries at the hook
  std::vector<int> rows_from;             // per local layer; -1: this layer wants none
  std::vector<std::vector<float>> sums;   // per local layer: [n_heads_local][stride]
  // Per local layer, or empty: the rows give KVzip's column maxima instead of sums (PolicyNeeds::prefill_row_maxima).
  std::vector<std::optional<ColumnMaxima>> maxima;
  // Per local layer, or empty: the queries before RoPE of the rows at positions >= moments_from[l] are added to
  // moments[l] (PolicyNeeds::query_moments_from; -1 and nullopt: none).
  std::vector<int> moments_from;
  std::vector<std::optional<QueryMoments>> moments;
};

// PoD for one sequence (kernels/pod_attention.h, cache/pod_blocks.h): its window and, for every local layer and
// local KV head, the global layer whose queries and keys score the distant entries (the block's leader, on this
// stage: blocks never cross a stage boundary). The leader's queries of the step are kept until the stage ends.
struct PodSequence {
  PodWindow window;
  std::vector<std::vector<int>> leader;  // [local layer][local KV head] -> global layer
};

// One sequence's part of a step.
struct BatchSequence {
  SeqId seq = 0;
  std::span<const int32_t> tokens;  // the new tokens: a prefill chunk, or the one token of a decode step
  int start_pos = 0;                // position of tokens[0]
  LogitsMode logits = LogitsMode::last;
  AttentionStats* stats = nullptr;  // statistics to accumulate in this step (nullable)
  const PodSequence* pod = nullptr;  // PoD attention in every layer (nullable)
  const RowSampling* sampling = nullptr;  // LogitsMode::sample: how to choose the token (on the last stage)
};

// The batch cut into at most n micro-batches of about equal token counts (n, or fewer when the batch has fewer
// tokens), in batch order. A prefill chunk may be cut between tokens: its pieces keep their positions, statistics
// and PoD state, and only its last piece asks for LogitsMode::last's row. Every rank cuts a step the same way.
std::vector<std::vector<BatchSequence>> split_micro_batches(std::span<const BatchSequence> batch, int n);

// The groups a shard exchanges activations with. Null when the shard has no such peers.
struct ShardComms {
  Comm* tp = nullptr;  // the stage's tensor-parallel group; needed when weights.shard.tp_size > 1
  Comm* pp = nullptr;  // the pipeline chain (group rank = stage); needed when the shard lacks the embedding or
                       // the output head
  // The same groups on device memory (NCCL, parallel/nccl_comm.h), for a GPU backend: when set, activations cross
  // ranks without a copy to the host; otherwise they go through the host and `tp` / `pp`.
  DeviceComm* tp_device = nullptr;
  DeviceComm* pp_device = nullptr;
};

class LlamaModel {
 public:
  // Throws std::invalid_argument when the shard needs a communicator that `comms` lacks.
  LlamaModel(Backend& backend, const ModelWeights& weights, ShardComms comms = {});
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const { return weights_.config; }
  // Query and KV heads this rank holds (all of them until tensor parallelism splits them).
  int n_heads_local() const { return n_heads_local_; }
  int n_kv_heads_local() const { return n_kv_heads_local_; }
  // The first of them, as a global KV head index.
  int kv_head_begin() const { return weights_.shard.tp_rank * n_kv_heads_local_; }
  KvBlockLayout kv_layout(int block_size) const;

  // The last pipeline stage computes logits; the others pass their hidden states on.
  bool has_output() const { return weights_.shard.has_output; }
  // Micro-batches per step (parallel.micro_batches): 1 runs every step whole. Every rank of the world must use the
  // same number. Rows are independent, so pieces compute what the whole step computes, up to the GEMM's blocking
  // over rows (BLAS kernels sum in an order that can depend on the row count; docs/distributed.md).
  void set_micro_batches(int n) { micro_batches_ = std::max(1, n); }

  // Appends the batch's tokens to `cache` (the leader's scheduler fits every step in the pool; an append that does
  // not fit throws) and runs the shard.
  // `logits` receives one row of vocab_size floats per requested position, in batch order: one row for
  // LogitsMode::last, one per token for LogitsMode::all; `samples` one token per LogitsMode::sample sequence, in
  // batch order. On a stage without the output head both are left empty. Every rank of the world runs the same
  // batch (the step plan), which is how neighbours know the sizes.
  void forward(std::span<const BatchSequence> batch, KvCache& cache, std::vector<float>& logits,
               std::vector<RowSample>& samples);
  // The same for a batch without LogitsMode::sample sequences (std::invalid_argument otherwise).
  void forward(std::span<const BatchSequence> batch, KvCache& cache, std::vector<float>& logits);

 private:
  struct UploadedLayer {
    Tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  };
  struct Workspace;

  Tensor upload(const WeightMatrix& m);
  void forward_micro_batch(std::span<const BatchSequence> batch, std::vector<float>& sent, KvCache& cache,
                           std::vector<float>& logits, std::vector<RowSample>& samples);
  void tp_all_reduce(Tensor& t);
  void recv_hidden(Tensor& x);
  void send_hidden(const Tensor& x, std::vector<float>& sent);
  void wait_sends();
  void gather_vocab(const Tensor& out, int64_t n, std::span<float> all);
  Tensor head_slice(const Tensor& x, std::span<const int64_t> rows);
  void full_rows(const Tensor& slice, float* logits);
  void output_head(const Tensor& x, std::span<const int64_t> rows, std::vector<float>& logits);
  void output_samples(const Tensor& x, std::span<const int64_t> rows, std::span<const RowSampling> sampling,
                      std::vector<RowSample>& samples);
  void run_layer(int local_layer, std::span<const BatchSequence> batch, const KvCache& cache,
                 std::span<const AttentionSequence> seqs, std::span<const int32_t> positions);
  void attention(int local_layer, std::span<const BatchSequence> batch, const KvCache& cache,
                 std::span<const AttentionSequence> seqs, const Tensor& q, Tensor& out);
  void add_query_moments(int local_layer, std::span<const BatchSequence> batch,
                         std::span<const AttentionSequence> seqs, const Tensor& q);

  Backend& backend_;
  const ModelWeights& weights_;
  ShardComms comms_;
  int n_heads_local_;
  int n_kv_heads_local_;
  int d_ff_local_;
  RopeParams rope_;
  Tensor token_embd_, output_norm_, output_;
  std::vector<UploadedLayer> layers_;
  std::unique_ptr<Workspace> ws_;
  int micro_batches_ = 1;
  std::vector<float> host_;  // staging for what crosses ranks ([T, D] hidden states, logits slices)
  std::vector<float> query_rows_;  // staging for the query rows whose moments a policy asks for
  std::vector<float> sampled_logits_;  // full logits rows of a vocabulary-parallel head, sampled on the host
  std::vector<std::vector<float>> sent_;  // per micro-batch: [T, D] hidden states on their way to the next stage
};

}  // namespace strata
