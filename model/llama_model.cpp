#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace strata {

// Step activations, grown to the largest step seen and reused.
struct LlamaModel::Workspace {
  int64_t capacity = 0;
  Tensor x, h, q, k, v, attn, o, gate, up, act, down;
  Tensor head_in, head_norm, head_out;
  int64_t head_capacity = 0;
  Tensor head_all;  // [tp * rows, vocab_local]: the gathered slices, with a device communicator
  // PoD: every local layer's queries of the step, so that a block's followers score the distant entries with
  // their leader's (spec §4). Allocated on the first step with a PoD sequence.
  std::vector<Tensor> q_layers;
  int64_t q_layers_capacity = 0;
};

LlamaModel::LlamaModel(Backend& backend, const ModelWeights& weights, ShardComms comms)
    : backend_(backend), weights_(weights), comms_(comms), ws_(std::make_unique<Workspace>()) {
  const ModelConfig& c = weights.config;
  const int tp = weights.shard.tp_size;
  if (tp > 1 && (comms.tp == nullptr || comms.tp->size() != tp)) {
    throw std::invalid_argument("llama model: a shard of tp_size " + std::to_string(tp) +
                                " needs a tensor-parallel group of that size");
  }
  if ((!weights.shard.has_embedding || !weights.shard.has_output) && comms.pp == nullptr) {
    throw std::invalid_argument("llama model: a pipeline stage without the embedding or the output head needs its "
                                "pipeline neighbours");
  }
  n_heads_local_ = c.n_heads / tp;
  n_kv_heads_local_ = c.n_kv_heads / tp;
  d_ff_local_ = c.d_ff / tp;
  rope_ = RopeParams{c.rope_style, c.rope_theta, c.rope_scaling};

  if (weights.shard.has_embedding) token_embd_ = upload(weights.token_embd);
  if (weights.shard.has_output) {
    output_norm_ = upload(weights.output_norm);
    output_ = upload(weights.output);
  }
  for (const LayerWeights& l : weights.layers) {
    layers_.push_back(UploadedLayer{upload(l.attn_norm), upload(l.wq), upload(l.wk), upload(l.wv), upload(l.wo),
                                    upload(l.ffn_norm), upload(l.w_gate), upload(l.w_up), upload(l.w_down)});
  }
}

LlamaModel::~LlamaModel() {
  Workspace& w = *ws_;
  for (Tensor* t : {&w.x, &w.h, &w.q, &w.k, &w.v, &w.attn, &w.o, &w.gate, &w.up, &w.act, &w.down, &w.head_in,
                    &w.head_norm, &w.head_out, &w.head_all}) {
    if (t->data) backend_.free(*t);
  }
  for (Tensor& t : w.q_layers) backend_.free(t);
}

Tensor LlamaModel::upload(const WeightMatrix& m) { return backend_.upload_weight(m); }

KvBlockLayout LlamaModel::kv_layout(int block_size) const {
  return KvBlockLayout{n_kv_heads_local_, config().head_dim, block_size, backend_.kv_dtype()};
}

static void ensure(Backend& backend, Tensor& t, int64_t rows, int64_t cols) {
  if (t.data && t.rows >= rows && t.cols == cols) return;
  if (t.data) backend.free(t);
  t = backend.alloc(rows, cols, DType::f32);
}

std::vector<std::vector<BatchSequence>> split_micro_batches(std::span<const BatchSequence> batch, int n) {
  int64_t n_tokens = 0;
  for (const BatchSequence& s : batch) n_tokens += int64_t(s.tokens.size());
  const int64_t n_micro = std::clamp<int64_t>(n_tokens, 1, std::max(1, n));
  std::vector<std::vector<BatchSequence>> micro(static_cast<size_t>(n_micro));
  int64_t placed = 0;
  size_t m = 0;
  for (const BatchSequence& s : batch) {
    size_t offset = 0;
    do {
      const int64_t end = (int64_t(m) + 1) * n_tokens / n_micro;  // micro-batch m ends before this token
      const size_t take = std::min(s.tokens.size() - offset, size_t(end - placed));
      BatchSequence piece = s;
      piece.tokens = s.tokens.subspan(offset, take);
      piece.start_pos = s.start_pos + int(offset);
      const bool last_row_only = s.logits == LogitsMode::last || s.logits == LogitsMode::sample;
      if (last_row_only && offset + take < s.tokens.size()) piece.logits = LogitsMode::none;
      micro[m].push_back(piece);
      offset += take;
      placed += int64_t(take);
      if (placed == end && m + 1 < micro.size()) ++m;
    } while (offset < s.tokens.size());
  }
  return micro;
}

void LlamaModel::forward(std::span<const BatchSequence> batch, KvCache& cache, std::vector<float>& logits) {
  for (const BatchSequence& s : batch) {
    if (s.logits == LogitsMode::sample) {
      throw std::invalid_argument("sequence " + std::to_string(s.seq) + " asks for a sampled token, which needs "
                                  "forward's samples output");
    }
  }
  std::vector<RowSample> no_samples;
  forward(batch, cache, logits, no_samples);
}

void LlamaModel::forward(std::span<const BatchSequence> batch, KvCache& cache, std::vector<float>& logits,
                         std::vector<RowSample>& samples) {
  const ModelConfig& c = config();
  for (const BatchSequence& s : batch) {
    if (s.start_pos + int(s.tokens.size()) > c.max_context) {
      throw std::invalid_argument("sequence " + std::to_string(s.seq) + " goes past the model's context of " +
                                  std::to_string(c.max_context));
    }
    if (s.logits == LogitsMode::sample && s.sampling == nullptr) {
      throw std::invalid_argument("sequence " + std::to_string(s.seq) + " asks for a sampled token without its "
                                  "sampling");
    }
    for (int32_t id : s.tokens) {
      if (id < 0 || id >= c.vocab_size) {
        throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
      }
    }
  }
  logits.clear();
  samples.clear();
  const std::vector<std::vector<BatchSequence>> micro = split_micro_batches(batch, micro_batches_);
  sent_.resize(std::max(sent_.size(), micro.size()));
  for (size_t m = 0; m < micro.size(); ++m) forward_micro_batch(micro[m], sent_[m], cache, logits, samples);
  // The stage's last micro-batch has left once the next stage has taken it; the buffers are free again.
  if (!weights_.shard.has_output) wait_sends();
}

namespace {

// Layer l's attention sequences of the batch (global_layer of the model): each sequence's rows, the entries before
// them and its block table, and where it asks for them the column sums of its attention statistics.
void attention_sequences(std::span<const BatchSequence> batch, const KvCache& cache, int global_layer, int l,
                         std::vector<AttentionSequence>& seqs) {
  int row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const LayerKv& kv = cache.layer(batch[i].seq, global_layer);
    const int n_q = int(batch[i].tokens.size());
    seqs[i] = AttentionSequence{row, n_q, kv.n_entries - n_q, kv.block_table};
    if (AttentionStats* st = batch[i].stats; st && st->rows_from[size_t(l)] >= 0) {
      if (kv.n_entries > st->stride) throw std::logic_error("attention statistics: stride below the entries held");
      seqs[i].column_sums = st->sums[size_t(l)].data();
      seqs[i].sums_stride = st->stride;
      seqs[i].stats_row_begin = std::max(0, st->rows_from[size_t(l)] - batch[i].start_pos);
      if (size_t(l) < st->maxima.size()) seqs[i].column_maxima = st->maxima[size_t(l)];
    }
    row += n_q;
  }
}

// The rows of a micro-batch that go through the output head, by what their sequences ask for.
struct HeadRows {
  std::vector<int64_t> logit_rows;    // LogitsMode::all and last
  std::vector<int64_t> sampled_rows;  // LogitsMode::sample, with their sampling
  std::vector<RowSampling> sampling;
};

HeadRows head_rows(std::span<const BatchSequence> batch) {
  HeadRows h;
  int64_t row = 0;
  for (const BatchSequence& s : batch) {
    const int64_t n = int64_t(s.tokens.size());
    if (s.logits == LogitsMode::all) {
      for (int64_t i = 0; i < n; ++i) h.logit_rows.push_back(row + i);
    } else if (s.logits == LogitsMode::last) {
      h.logit_rows.push_back(row + n - 1);
    } else if (s.logits == LogitsMode::sample) {
      h.sampled_rows.push_back(row + n - 1);
      h.sampling.push_back(*s.sampling);
    }
    row += n;
  }
  return h;
}

}  // namespace

// One micro-batch through this stage: its tokens go into the cache, its hidden states come from the embedding or
// the previous stage, and leave for the next stage (from `sent`, which stays untouched until forward() ends) or
// through the output head, whose rows are appended to `logits` and `samples`.
void LlamaModel::forward_micro_batch(std::span<const BatchSequence> batch, std::vector<float>& sent, KvCache& cache,
                                     std::vector<float>& logits, std::vector<RowSample>& samples) {
  const ModelConfig& c = config();
  const int hd = c.head_dim;
  const int64_t d = c.d_model;

  std::vector<int32_t> ids, positions;
  for (const BatchSequence& s : batch) {
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    for (size_t i = 0; i < s.tokens.size(); ++i) positions.push_back(s.start_pos + int(i));
  }
  for (const BatchSequence& s : batch) cache.append(s.seq, int(s.tokens.size()));
  const int64_t n_tokens = int64_t(ids.size());
  if (n_tokens == 0) return;

  Workspace& w = *ws_;
  if (n_tokens > w.capacity) {
    const int64_t cap = n_tokens;
    ensure(backend_, w.x, cap, d);
    ensure(backend_, w.h, cap, d);
    ensure(backend_, w.q, cap, int64_t(n_heads_local_) * hd);
    ensure(backend_, w.k, cap, int64_t(n_kv_heads_local_) * hd);
    ensure(backend_, w.v, cap, int64_t(n_kv_heads_local_) * hd);
    ensure(backend_, w.attn, cap, int64_t(n_heads_local_) * hd);
    ensure(backend_, w.o, cap, d);
    ensure(backend_, w.gate, cap, d_ff_local_);
    ensure(backend_, w.up, cap, d_ff_local_);
    ensure(backend_, w.act, cap, d_ff_local_);
    ensure(backend_, w.down, cap, d);
    w.capacity = cap;
  }
  const bool any_pod = std::any_of(batch.begin(), batch.end(), [](const BatchSequence& s) { return s.pod; });
  if ((any_pod || !w.q_layers.empty()) && n_tokens > w.q_layers_capacity) {  // once kept, always kept
    w.q_layers.resize(layers_.size());
    for (Tensor& t : w.q_layers) ensure(backend_, t, n_tokens, int64_t(n_heads_local_) * hd);
    w.q_layers_capacity = n_tokens;
  }
  Tensor x = w.x.slice_rows(0, n_tokens);
  if (weights_.shard.has_embedding) {
    backend_.embedding(ids, token_embd_, x);
  } else {
    recv_hidden(x);
  }

  std::vector<AttentionSequence> seqs(batch.size());
  for (int l = 0; l < int(layers_.size()); ++l) {
    attention_sequences(batch, cache, weights_.shard.layer_begin + l, l, seqs);
    run_layer(l, batch, cache, seqs, positions);
  }

  if (!weights_.shard.has_output) {
    send_hidden(x, sent);
    return;
  }
  // Output head for the rows that need logits only.
  const HeadRows head = head_rows(batch);
  output_head(x, head.logit_rows, logits);
  output_samples(x, head.sampled_rows, head.sampling, samples);
}

// Chunks of rows bound the [rows, vocab] scratch when every position wants logits (evaluation, tests).
constexpr int64_t kHeadChunk = 256;

// This rank's [rows, vocab_local] slice of the logits of up to kHeadChunk rows of x, in the workspace (valid until
// the next call).
Tensor LlamaModel::head_slice(const Tensor& x, std::span<const int64_t> rows) {
  const ModelConfig& c = config();
  Workspace& w = *ws_;
  const int64_t n = int64_t(rows.size());
  if (n > w.head_capacity) {
    ensure(backend_, w.head_in, n, c.d_model);
    ensure(backend_, w.head_norm, n, c.d_model);
    ensure(backend_, w.head_out, n, output_.rows);
    w.head_capacity = n;
  }
  Tensor in = w.head_in.slice_rows(0, n), normed = w.head_norm.slice_rows(0, n);
  Tensor out = w.head_out.slice_rows(0, n);
  backend_.gather_rows(x, rows, in);
  backend_.rmsnorm(in, output_norm_, c.rms_eps, normed);
  backend_.matmul(normed, output_, out);
  return out;
}

// The full logits rows of a head slice, on the host: copied, or, with a vocabulary-parallel head, every rank's
// [n, vocab_local] slice gathered and laid side by side.
void LlamaModel::full_rows(const Tensor& slice, float* logits) {
  const int64_t vocab = config().vocab_size, vocab_local = output_.rows, tp = vocab / vocab_local, n = slice.rows;
  if (tp == 1) {
    backend_.copy_to_host(slice, logits);
    return;
  }
  host_.resize(size_t(n * vocab_local * (tp + 1)));
  std::span<float> all(host_.data() + n * vocab_local, size_t(n * vocab_local * tp));
  gather_vocab(slice, n, all);
  for (int64_t r = 0; r < tp; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const float* src = all.data() + (r * n + i) * vocab_local;
      std::copy(src, src + vocab_local, logits + i * vocab + r * vocab_local);
    }
  }
}

void LlamaModel::output_head(const Tensor& x, std::span<const int64_t> rows, std::vector<float>& logits) {
  const int64_t vocab = config().vocab_size;
  const int64_t first = int64_t(logits.size()) / vocab;  // rows of earlier micro-batches stay
  logits.resize(size_t((first + int64_t(rows.size())) * vocab));
  for (int64_t r0 = 0; r0 < int64_t(rows.size()); r0 += kHeadChunk) {
    const int64_t n = std::min<int64_t>(kHeadChunk, int64_t(rows.size()) - r0);
    full_rows(head_slice(x, rows.subspan(size_t(r0), size_t(n))), logits.data() + (first + r0) * vocab);
  }
}

// A token chosen from each row by its sampling. Without tensor parallelism the backend samples the rows where
// they are; a vocabulary-parallel head gathers the full rows first and samples them here, by the same rule
// (kernels/token_sampling.h), so every rank of the stage chooses the same tokens.
void LlamaModel::output_samples(const Tensor& x, std::span<const int64_t> rows, std::span<const RowSampling> sampling,
                                std::vector<RowSample>& samples) {
  const int64_t vocab = config().vocab_size;
  const size_t first = samples.size();  // tokens of earlier micro-batches stay
  samples.resize(first + rows.size());
  for (int64_t r0 = 0; r0 < int64_t(rows.size()); r0 += kHeadChunk) {
    const int64_t n = std::min<int64_t>(kHeadChunk, int64_t(rows.size()) - r0);
    Tensor slice = head_slice(x, rows.subspan(size_t(r0), size_t(n)));
    const std::span<const RowSampling> chunk = sampling.subspan(size_t(r0), size_t(n));
    std::span<RowSample> out(samples.data() + first + size_t(r0), size_t(n));
    if (output_.rows == vocab) {
      backend_.sample_rows(slice, chunk, out);
      continue;
    }
    sampled_logits_.resize(size_t(n * vocab));
    full_rows(slice, sampled_logits_.data());
    for (int64_t i = 0; i < n; ++i) {
      out[size_t(i)] = sample_row_on_host({sampled_logits_.data() + i * vocab, size_t(vocab)}, chunk[size_t(i)]);
    }
  }
}

// The row-parallel projections leave each rank with a partial sum of the [T, D] output: add them up.
void LlamaModel::tp_all_reduce(Tensor& t) {
  if (comms_.tp == nullptr || comms_.tp->size() == 1) return;
  if (comms_.tp_device) {
    comms_.tp_device->all_reduce_sum({t.f32(), size_t(t.rows * t.cols)});
    return;
  }
  host_.resize(size_t(t.rows * t.cols));
  backend_.copy_to_host(t, host_.data());
  comms_.tp->all_reduce_sum(host_);
  backend_.copy_from_host(host_.data(), t);
}

// A micro-batch's [T, D] hidden states from the previous stage.
void LlamaModel::recv_hidden(Tensor& x) {
  const int src = comms_.pp->rank() - 1;
  if (comms_.pp_device) {
    comms_.pp_device->recv({x.f32(), size_t(x.rows * x.cols)}, src);
    return;
  }
  host_.resize(size_t(x.rows * x.cols));
  comms_.pp->recv(host_, src);
  backend_.copy_from_host(host_.data(), x);
}

// ... and to the next one, without waiting for it to take them: through the host from `sent` (left untouched
// until wait_sends()), or from the device communicator's own copy.
void LlamaModel::send_hidden(const Tensor& x, std::vector<float>& sent) {
  const int dest = comms_.pp->rank() + 1;
  if (comms_.pp_device) {
    comms_.pp_device->send_async({x.f32(), size_t(x.rows * x.cols)}, dest);
    return;
  }
  sent.resize(size_t(x.rows * x.cols));
  backend_.copy_to_host(x, sent.data());
  comms_.pp->send_async(sent, dest);
}

void LlamaModel::wait_sends() {
  if (comms_.pp_device) {
    comms_.pp_device->wait_sends();
  } else {
    comms_.pp->wait_sends();
  }
}

// Every TP rank's [n, vocab_local] slice of the head's output, by rank, into host memory.
void LlamaModel::gather_vocab(const Tensor& out, int64_t n, std::span<float> all) {
  const int64_t vocab_local = out.cols;
  if (comms_.tp_device) {
    const int64_t rows = n * comms_.tp_device->size();
    Workspace& w = *ws_;
    ensure(backend_, w.head_all, rows, vocab_local);
    Tensor gathered = w.head_all.slice_rows(0, rows);
    comms_.tp_device->all_gather({out.f32(), size_t(n * vocab_local)}, {gathered.f32(), size_t(rows * vocab_local)});
    backend_.copy_to_host(gathered, all.data());
    return;
  }
  std::span<float> mine(host_.data(), size_t(n * vocab_local));
  backend_.copy_to_host(out, mine.data());
  comms_.tp->all_gather<float>(mine, all);
}

// Keys are rotated with their sequence positions before they are stored, so they keep those positions when a
// policy later removes entries around them (design rule 5).
void LlamaModel::run_layer(int local_layer, std::span<const BatchSequence> batch, const KvCache& cache,
                           std::span<const AttentionSequence> seqs, std::span<const int32_t> positions) {
  const ModelConfig& c = config();
  const UploadedLayer& lw = layers_[size_t(local_layer)];
  Workspace& w = *ws_;
  const KvPoolView pool = cache.pool_view();
  const int64_t n = seqs.empty() ? 0 : seqs.back().q_begin + seqs.back().n_q;
  Tensor x = w.x.slice_rows(0, n), h = w.h.slice_rows(0, n);
  const Tensor& q_all = w.q_layers.empty() ? w.q : w.q_layers[size_t(local_layer)];
  Tensor q = q_all.slice_rows(0, n), k = w.k.slice_rows(0, n), v = w.v.slice_rows(0, n);
  Tensor attn = w.attn.slice_rows(0, n), o = w.o.slice_rows(0, n);
  Tensor gate = w.gate.slice_rows(0, n), up = w.up.slice_rows(0, n), act = w.act.slice_rows(0, n);
  Tensor down = w.down.slice_rows(0, n);

  backend_.rmsnorm(x, lw.attn_norm, c.rms_eps, h);
  const Tensor* qkv_weights[] = {&lw.wq, &lw.wk, &lw.wv};
  Tensor* qkv[] = {&q, &k, &v};
  backend_.matmul_shared_input(h, qkv_weights, qkv);
  add_query_moments(local_layer, batch, seqs, q);
  const Tensor* wo[] = {&lw.wo};
  backend_.prefetch_weights(wo);
  backend_.rope(q, positions, n_heads_local_, c.head_dim, rope_);
  backend_.rope(k, positions, n_kv_heads_local_, c.head_dim, rope_);
  backend_.kv_write(k, v, seqs, pool);
  attention(local_layer, batch, cache, seqs, q, attn);
  backend_.matmul(attn, lw.wo, o);
  tp_all_reduce(o);
  const Tensor* mlp_weights[] = {&lw.w_gate, &lw.w_up};
  backend_.prefetch_weights(mlp_weights);
  backend_.add(x, o);

  backend_.rmsnorm(x, lw.ffn_norm, c.rms_eps, h);
  Tensor* gate_up[] = {&gate, &up};
  backend_.matmul_shared_input(h, mlp_weights, gate_up);
  const Tensor* w_down[] = {&lw.w_down};
  backend_.prefetch_weights(w_down);
  backend_.silu_mul(gate, up, act);
  backend_.matmul(act, lw.w_down, down);
  if (size_t(local_layer + 1) < layers_.size()) {
    const UploadedLayer& next = layers_[size_t(local_layer + 1)];
    const Tensor* next_qkv[] = {&next.wq, &next.wk, &next.wv};
    backend_.prefetch_weights(next_qkv);
  }
  tp_all_reduce(down);
  backend_.add(x, down);
}

// The queries before RoPE of the rows whose moments a sequence's policy asks for (AttentionStats::moments), added
// on the host: a copy of those rows (a memcpy on the CPU backend), then QueryMoments' double sums.
void LlamaModel::add_query_moments(int local_layer, std::span<const BatchSequence> batch,
                                   std::span<const AttentionSequence> seqs, const Tensor& q) {
  const size_t l = size_t(local_layer);
  for (size_t i = 0; i < batch.size(); ++i) {
    AttentionStats* st = batch[i].stats;
    if (!st || l >= st->moments.size() || !st->moments[l]) continue;
    const int first = std::max(0, st->moments_from[l] - batch[i].start_pos);
    const int n = seqs[i].n_q - first;
    if (n <= 0) continue;
    query_rows_.resize(size_t(n) * size_t(q.cols));
    backend_.copy_to_host(q.slice_rows(seqs[i].q_begin + first, n), query_rows_.data());
    st->moments[l]->add_rows(query_rows_.data(), n, q.cols);
  }
}

// Plain paged attention for the batch's other sequences; PoD attention for its PoD sequences, whose distant
// entries are scored with their block leader's queries (kept in q_layers) and keys (the leader's block table).
void LlamaModel::attention(int local_layer, std::span<const BatchSequence> batch, const KvCache& cache,
                           std::span<const AttentionSequence> seqs, const Tensor& q, Tensor& out) {
  const float scale = 1.0f / std::sqrt(float(config().head_dim));
  std::vector<AttentionSequence> plain, pod;
  std::vector<PodDistant> distant;
  const PodWindow* window = nullptr;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].pod) {
      plain.push_back(seqs[i]);
      continue;
    }
    const PodSequence& p = *batch[i].pod;
    // One window per call: sequences with another window go to a call of their own below.
    if (window && (window->sinks != p.window.sinks || window->recent != p.window.recent)) continue;
    window = &p.window;
    pod.push_back(seqs[i]);
    PodDistant d;
    for (int h = 0; h < n_kv_heads_local_; ++h) {
      const int leader = p.leader[size_t(local_layer)][size_t(h)];
      d.key_tables.push_back(cache.layer(batch[i].seq, leader).block_table);
      d.queries.push_back(ws_->q_layers[size_t(leader - weights_.shard.layer_begin)].f32());
    }
    distant.push_back(std::move(d));
  }
  if (!plain.empty()) {
    backend_.paged_attention(q, plain, cache.pool_view(), n_heads_local_, scale, out);
  }
  if (!pod.empty()) {
    backend_.pod_attention(q, pod, distant, cache.pool_view(), n_heads_local_, scale, *window, out);
  }
  // Rare: PoD sequences of the batch with a different window than the first.
  std::vector<BatchSequence> rest;
  std::vector<AttentionSequence> rest_seqs;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].pod && (batch[i].pod->window.sinks != window->sinks || batch[i].pod->window.recent != window->recent)) {
      rest.push_back(batch[i]);
      rest_seqs.push_back(seqs[i]);
    }
  }
  if (!rest.empty()) attention(local_layer, rest, cache, rest_seqs, q, out);
}

}  // namespace strata
