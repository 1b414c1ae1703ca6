// strata bench: prefill and decode throughput of the engine, in-process (no HTTP), for several batch sizes.
// Each batch size runs B requests of P random prompt tokens that each generate G tokens (greedy, EOS ignored):
//   prefill tokens/s = B*P / (time until every request has its first token)
//   decode tokens/s  = B*(G-1) / (time from the last first token to the end)
// With --policy SPEC every request uses that KV compression policy; with the pool fixed (kv_cache.memory_mib),
// max_concurrent (the most sequences decoding at one time) shows how compression turns into capacity.
//
// --context N[,N...] measures decoding at long context without paying for its prefill: each of the B sequences
// starts with N - P synthetic cache entries (random keys and values written through the backend, positions
// 0..N-P-1), then P real prompt tokens are prefilled at positions N-P..N-1 (so that a policy decides at the
// prompt's end, over every entry, as after a real prompt; its statistics come from those P rows only), and G
// tokens are decoded. The bench drives the step executor directly, one timed step at a time.
//
// Every result carries the bandwidth account of its decode steps (docs/gpu.md): the bytes a step reads (the
// shard's weight matrices at the backend's element size, and the KV entries attention reads) over the step time,
// and with --copy-bandwidth-gbs the fraction of that measured limit.
// Raw results go to --out as JSON with the machine, the command and the configuration, rewritten after every result.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <thread>
#include <variant>

#include <nlohmann/json.hpp>

#include "cache/compression_policy.h"
#include "daemon/build_commit.h"
#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/machine_info.h"
#include "daemon/runtime.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "rank/offline_executor.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

class TimingSink final : public GenerationSink {
 public:
  void on_event(GenerationEvent event) override {
    if (auto* d = std::get_if<ChoiceDelta>(&event)) {
      if (!first_token && !d->token_ids.empty()) first_token = Clock::now();
      n_tokens += int(d->token_ids.size());
    } else if (std::holds_alternative<RequestFinished>(event)) {
      done = Clock::now();
    } else if (auto* e = std::get_if<RequestFailed>(&event)) {
      error = e->message;
    }
  }
  bool cancelled() const override { return false; }

  std::optional<Clock::time_point> first_token, done;  // done: the request's last event
  int n_tokens = 0;
  std::string error;
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The most requests between their first token and their end at one time.
int max_concurrent(const std::vector<std::shared_ptr<TimingSink>>& sinks) {
  std::vector<std::pair<Clock::time_point, int>> events;
  for (const auto& s : sinks) {
    events.emplace_back(*s->first_token, +1);
    events.emplace_back(*s->done, -1);
  }
  std::sort(events.begin(), events.end());  // at equal times an end (-1) sorts before a start (+1)
  int now = 0, most = 0;
  for (const auto& [t, d] : events) most = std::max(most, now += d);
  return most;
}

// ---------------------------------------------------------------------------------------------------------------
// The bandwidth account of a decode step

// KV bytes attention reads in one layer of one sequence in a decode step: the entries it holds and the step's new
// one. Sealed groups count at the quantized block's size and SpindleKV's coded blocks at theirs (their codebook
// vectors are not counted); the other entries at full precision.
int64_t kv_read_bytes(const LayerKv& kv, const KvBlockLayout& layout) {
  const int64_t packed_blocks = kv.n_quantized_blocks + kv.n_coded_blocks;
  const int64_t packed_bytes = (kv.n_quantized_blocks ? kv.n_quantized_blocks * layout.quantized_block_bytes() : 0) +
                               (kv.n_coded_blocks ? kv.n_coded_blocks * layout.coded_block_bytes() : 0);
  const int64_t rest = std::max<int64_t>(0, kv.n_entries + 1 - packed_blocks * layout.block_size);
  return packed_bytes + rest * layout.entry_bytes();
}

nlohmann::json bandwidth_account(int64_t weight_bytes, double kv_bytes, double step_seconds,
                                 std::optional<double> copy_gbs) {
  const double bytes = double(weight_bytes) + kv_bytes;
  const double achieved_gbs = bytes / step_seconds / 1e9;
  nlohmann::json a = {{"weight_bytes_per_step", weight_bytes},
                      {"kv_bytes_per_step", kv_bytes},
                      {"bytes_per_step", bytes},
                      {"seconds_per_step", step_seconds},
                      {"achieved_gbs", achieved_gbs}};
  if (copy_gbs) {
    a["copy_bandwidth_gbs"] = *copy_gbs;
    a["fraction_of_copy_bandwidth"] = achieved_gbs / *copy_gbs;
  }
  return a;
}

// What every measurement of one bench command shares.
struct BenchSetup {
  RankRuntime& rt;
  int n_prompt = 0;           // prompt tokens; with --context, the real ones at the context's end
  int n_gen = 0;
  std::optional<PolicySpec> policy;  // the request policy; none: the server's configuration
  int64_t weight_bytes = 0;   // weight bytes a decode step reads
  std::optional<double> copy_gbs;
  std::mt19937& rng;
};

// ---------------------------------------------------------------------------------------------------------------
// Decoding at a synthetic context (--context)

// Synthetic rows written per kv_write: one random block reused for every range of entries, so that filling a long
// context costs device copies, not host random numbers.
constexpr int kSyntheticRows = 1024;

// Writes entries [0, n_entries) of every local layer of `seqs` (already appended to the cache) through the
// backend, keys and values uniform in [-1, 1] from `seed`. One sequence per call, as the model writes a prefill.
void write_synthetic_entries(Backend& backend, const KvCache& cache, std::span<const SeqId> seqs, int n_entries,
                             uint32_t seed) {
  if (n_entries == 0) return;
  const KvBlockLayout& layout = cache.pool().layout();
  const int64_t width = int64_t(layout.n_kv_heads) * layout.head_dim;
  const int rows = std::min(n_entries, kSyntheticRows);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> host(size_t(rows * width));
  Tensor k = backend.alloc(rows, width, DType::f32), v = backend.alloc(rows, width, DType::f32);
  for (Tensor* t : {&k, &v}) {
    for (float& x : host) x = uniform(rng);
    backend.copy_from_host(host.data(), *t);
  }
  const KvPoolView pool = cache.pool_view();
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    for (SeqId seq : seqs) {
      for (int at = 0; at < n_entries; at += rows) {
        const int n = std::min(rows, n_entries - at);
        const AttentionSequence part{0, n, at, cache.layer(seq, l).block_table};
        backend.kv_write(k.slice_rows(0, n), v.slice_rows(0, n), {&part, 1}, pool);
      }
    }
  }
  backend.free(k);
  backend.free(v);
}

// Why one batch size cannot run at n_context, if it cannot: the model's context or the KV pool is too small.
std::optional<std::string> context_skip_reason(const RankRuntime& rt, int batch, int n_context, int n_gen) {
  const int max_context = rt.weights.config.max_context;
  if (n_context + n_gen > max_context) {
    return "context + gen-tokens exceeds the model's context of " + std::to_string(max_context);
  }
  const int64_t blocks = batch * rt.cache->blocks_to_append(-1, n_context + n_gen);
  if (blocks > rt.cache->pool().n_free()) {
    return "needs " + std::to_string(blocks) + " KV blocks, the pool has " +
           std::to_string(rt.cache->pool().n_free()) + " (kv_cache.memory_mib)";
  }
  return std::nullopt;
}

// The sequences of one measurement at a synthetic context, and the token each feeds its next step.
struct ContextBatch {
  std::vector<SeqId> seqs;
  std::vector<int32_t> last;

  void record(const StepResult& result) {
    for (const SampledToken& t : result.sampled) {
      last[size_t(std::find(seqs.begin(), seqs.end(), t.seq) - seqs.begin())] = t.sample.id;
    }
  }
};

// Adds `batch` greedy sequences of n_context prompt tokens to the executor; their ids are drawn from next_seq.
ContextBatch add_sequences(const BenchSetup& setup, SeqId& next_seq, int batch, int n_context) {
  StepPlan plan;
  ContextBatch b;
  for (int i = 0; i < batch; ++i) {
    const SeqId seq = next_seq++;
    b.seqs.push_back(seq);
    SamplingRule greedy;
    greedy.temperature = 0.0f;
    plan.added.push_back(PlannedSequence{seq, greedy, uint64_t(seq), setup.policy, n_context});
  }
  setup.rt.executor->execute(plan);
  b.last.assign(b.seqs.size(), 0);
  return b;
}

// Gives every sequence its first n_synthetic entries, random, and starts its prefill after them.
void write_synthetic_context(const BenchSetup& setup, std::span<const SeqId> seqs, int n_synthetic, int n_context) {
  KvCache& cache = *setup.rt.cache;
  for (SeqId seq : seqs) cache.append(seq, n_synthetic);
  write_synthetic_entries(*setup.rt.backend, cache, seqs, n_synthetic, uint32_t(setup.rng()));
  OfflineExecutor executor(*setup.rt.executor);
  for (SeqId seq : seqs) executor.start_prefill_with_entries(seq, n_context);
}

// Prefills each sequence's real tail, prompts[i] at positions n_synthetic.., in chunks of every sequence, at most
// max_batch_tokens per step and one chunk per sequence; the last chunk samples the first token.
void prefill_tail(const BenchSetup& setup, ContextBatch& b, const std::vector<std::vector<int32_t>>& prompts,
                  int n_synthetic, int max_batch_tokens) {
  const int tail = int(prompts.front().size());
  std::vector<int> done(b.seqs.size(), 0);
  for (uint64_t step = 0; std::any_of(done.begin(), done.end(), [&](int d) { return d < tail; }); ++step) {
    StepPlan p;
    p.step = step;
    int budget = max_batch_tokens;
    for (size_t i = 0; i < b.seqs.size() && budget > 0; ++i) {
      const int n = std::min(budget, tail - done[i]);
      if (n <= 0) continue;
      PlannedWork w;
      w.seq = b.seqs[i];
      w.start_pos = n_synthetic + done[i];
      w.tokens.assign(prompts[i].begin() + done[i], prompts[i].begin() + done[i] + n);
      w.sample = done[i] + n == tail;
      w.prefill_len = n_synthetic + tail;
      p.work.push_back(std::move(w));
      done[i] += n;
      budget -= n;
    }
    b.record(setup.rt.executor->execute(p));
  }
}

// What the decode steps read from the KV cache and how long each took.
struct DecodeSteps {
  double kv_bytes = 0.0;
  std::vector<double> seconds;  // sorted
};

// Decodes gen-tokens - 1 tokens of every sequence, one timed step per token.
DecodeSteps decode_steps(const BenchSetup& setup, ContextBatch& b, int n_context) {
  const KvCache& cache = *setup.rt.cache;
  const KvBlockLayout& layout = cache.pool().layout();
  DecodeSteps d;
  for (int g = 1; g < setup.n_gen; ++g) {
    StepPlan p;
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
        d.kv_bytes += double(kv_read_bytes(cache.layer(b.seqs[i], l), layout));
      }
      PlannedWork w;
      w.seq = b.seqs[i];
      w.start_pos = n_context + g - 1;
      w.tokens = {b.last[i]};
      w.sample = true;
      p.work.push_back(std::move(w));
    }
    const Clock::time_point t0 = Clock::now();
    b.record(setup.rt.executor->execute(p));
    d.seconds.push_back(seconds(t0, Clock::now()));
  }
  std::sort(d.seconds.begin(), d.seconds.end());
  return d;
}

// One batch size at one context length; seq ids are drawn from next_seq.
nlohmann::json run_at_context(const BenchSetup& setup, int max_batch_tokens, SeqId& next_seq, int batch,
                              int n_context) {
  const int tail = std::min(setup.n_prompt, n_context);
  const int n_synthetic = n_context - tail;
  nlohmann::json row = {{"batch", batch},
                        {"context", n_context},
                        {"context_kind", "synthetic"},
                        {"synthetic_entries", n_synthetic},
                        {"prefilled_tokens", tail}};
  if (std::optional<std::string> reason = context_skip_reason(setup.rt, batch, n_context, setup.n_gen)) {
    row["skipped"] = *reason;
    return row;
  }

  ContextBatch b = add_sequences(setup, next_seq, batch, n_context);
  const Clock::time_point write_start = Clock::now();
  write_synthetic_context(setup, b.seqs, n_synthetic, n_context);
  std::uniform_int_distribution<int> token(100, setup.rt.weights.config.vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts(b.seqs.size());
  for (auto& p : prompts) {
    for (int i = 0; i < tail; ++i) p.push_back(token(setup.rng));
  }
  const Clock::time_point prefill_start = Clock::now();
  prefill_tail(setup, b, prompts, n_synthetic, max_batch_tokens);
  const Clock::time_point decode_start = Clock::now();
  const DecodeSteps steps = decode_steps(setup, b, n_context);
  const Clock::time_point end = Clock::now();
  StepPlan finish;
  finish.finished = b.seqs;
  setup.rt.executor->execute(finish);

  const double decode_s = seconds(decode_start, end), prefill_s = seconds(prefill_start, decode_start);
  const int n_steps = setup.n_gen - 1;
  row["synthetic_write_seconds"] = seconds(write_start, prefill_start);
  row["prefill_seconds"] = prefill_s;
  row["prefill_tokens_per_second"] = batch * tail / prefill_s;
  row["decode_seconds"] = decode_s;
  row["decode_steps"] = n_steps;
  row["decode_tokens_per_second"] = batch * n_steps / decode_s;
  row["step_seconds"] = {{"min", steps.seconds.front()},
                         {"median", steps.seconds[steps.seconds.size() / 2]},
                         {"max", steps.seconds.back()}};
  row["bandwidth"] =
      bandwidth_account(setup.weight_bytes, steps.kv_bytes / n_steps, decode_s / n_steps, setup.copy_gbs);
  return row;
}

// ---------------------------------------------------------------------------------------------------------------
// Prefill and decode through the engine

// One batch size through the engine. kv_estimable: the bandwidth account may assume that the cache holds every
// entry (`full` at full precision).
nlohmann::json run_through_engine(const BenchSetup& setup, const Tokenizer& tokenizer, const EngineOptions& options,
                                  bool kv_estimable, int batch) {
  const auto& [rt, n_prompt, n_gen, policy, weight_bytes, copy_gbs, rng] = setup;
  const ModelConfig& mc = rt.weights.config;
  ServerMetrics metrics(mc.max_context, layer_metrics());
  EngineOptions o = options;
  o.limits.max_running = std::max(o.limits.max_running, batch);
  Engine engine(*rt.executor, *rt.cache, tokenizer, mc, metrics, o);
  std::uniform_int_distribution<int> token(100, mc.vocab_size - 1);
  std::vector<std::shared_ptr<TimingSink>> sinks;
  const Clock::time_point start = Clock::now();
  for (int b = 0; b < batch; ++b) {
    GenerationRequest r;
    r.id = "bench-" + std::to_string(b);
    for (int i = 0; i < n_prompt; ++i) r.prompt_ids.push_back(token(rng));
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = n_gen;
    r.sampling.ignore_eos = true;
    r.kv_policy = policy;
    sinks.push_back(std::make_shared<TimingSink>());
    r.sink = sinks.back();
    engine.submit(std::move(r));
  }
  engine.run_until_idle();
  Clock::time_point last_first = start, end = start;
  int generated = 0;
  for (const auto& s : sinks) {
    if (!s->error.empty()) throw std::runtime_error(s->error);
    last_first = std::max(last_first, *s->first_token);
    end = std::max(end, *s->done);
    generated += s->n_tokens;
  }
  const double prefill_s = seconds(start, last_first), decode_s = seconds(last_first, end);
  const int concurrent = max_concurrent(sinks);
  nlohmann::json row = {{"batch", batch},
                        {"prefill_seconds", prefill_s},
                        {"prefill_tokens_per_second", batch * n_prompt / prefill_s},
                        {"decode_seconds", decode_s},
                        {"decode_tokens_per_second", (generated - batch) / decode_s},
                        {"generated_tokens", generated},
                        {"total_seconds", seconds(start, end)},
                        {"generated_tokens_per_second_overall", generated / seconds(start, end)},
                        {"max_concurrent", concurrent}};
  if (kv_estimable && concurrent == batch) {
    // Decode step j (1 <= j < G) reads P + j entries per layer: P + G/2 on average.
    const double entries = double(batch) * rt.cache->n_layers() * (n_prompt + n_gen / 2.0);
    row["bandwidth"] = bandwidth_account(weight_bytes, entries * double(rt.pool->layout().entry_bytes()),
                                         decode_s / (n_gen - 1), copy_gbs);
    row["bandwidth"]["kv_bytes_estimated"] = "every layer holds the prompt and the tokens generated so far";
  } else {
    row["bandwidth"] = nullptr;  // a compressed or quantized cache, or a batch that did not decode together
  }
  return row;
}

constexpr const char* kUsage =
    "usage: strata bench --config FILE [--model PATH|preset:NAME] [--batch 1,8] [--prompt-tokens 128]\n"
    "                   [--gen-tokens 32] [--policy SPEC] [--context N[,N...]]\n"
    "                   [--copy-bandwidth-gbs X] [--out FILE.json] [--set section.key=value]...\n"
    "  --context N: decode after N cache entries, the last --prompt-tokens of them prefilled and the\n"
    "               others synthetic (random keys and values written through the backend)\n"
    "  --copy-bandwidth-gbs X: the measured memory bandwidth; results report the fraction reached\n"
    "  preset:llama-3-70b@layers=L: the 70B shapes with their first L layers\n";

// What the command line asks to measure.
struct BenchOptions {
  int n_prompt = 0;
  int n_gen = 0;
  std::vector<int> batches;
  std::vector<int> contexts;  // empty: prefill and decode through the engine
  std::string policy;         // empty: the server's configuration
  std::optional<double> copy_gbs;
};

BenchOptions parse_bench_options(const CommandLine& cl) {
  BenchOptions o;
  o.n_prompt = cl.get_int("prompt-tokens", 128);
  o.n_gen = cl.get_int("gen-tokens", 32);
  for (double b : cl.get_numbers("batch", "1,8")) o.batches.push_back(int(b));
  for (double n : cl.get_numbers("context", "")) o.contexts.push_back(int(n));
  o.policy = cl.get("policy", "");
  if (!o.policy.empty()) validate_policy(parse_policy_spec(o.policy));
  if (o.n_prompt < 1 || o.n_gen < 2) throw std::invalid_argument("--prompt-tokens must be >= 1 and --gen-tokens >= 2");
  for (int b : o.batches) {
    if (b < 1) throw std::invalid_argument("--batch: every size must be >= 1");
  }
  for (int n : o.contexts) {
    if (n < 1) throw std::invalid_argument("--context: every length must be >= 1");
  }
  if (cl.has("copy-bandwidth-gbs")) {
    o.copy_gbs = cl.get_double("copy-bandwidth-gbs", 0.0);
    if (*o.copy_gbs <= 0.0) throw std::invalid_argument("--copy-bandwidth-gbs must be > 0");
  }
  return o;
}

// The report without results: the machine, the command and the configuration measured.
nlohmann::json bench_report(const std::string& command, const ServerConfig& config, const RankRuntime& rt,
                            const BenchOptions& o) {
  const ModelConfig& mc = rt.weights.config;
  nlohmann::json report = {
      {"command", command},
      {"commit", build_commit()},
      {"machine", machine_json()},
      {"backend", rt.backend->name()},
      {"model", {{"path", config.model.path}, {"layers", mc.n_layers}, {"d_model", mc.d_model},
                 {"heads", mc.n_heads}, {"kv_heads", mc.n_kv_heads}, {"vocab", mc.vocab_size}}},
      {"prompt_tokens", o.n_prompt},
      {"gen_tokens", o.n_gen},
      {"max_batch_tokens", config.engine.max_batch_tokens},
      {"kv_pool", {{"memory_mib", config.kv_cache.memory_mib}, {"blocks", rt.pool->n_total()},
                   {"block_size", config.kv_cache.block_size}, {"dtype", config.kv_cache.dtype},
                   {"entry_bytes_per_layer", rt.pool->layout().entry_bytes()}}},
      {"weight_dtype", config.model.weight_dtype},
      {"activations", activations_name(config)},
      {"policy", o.policy.empty() ? config.kv_cache.policy : o.policy},
      {"results", nlohmann::json::array()}};
  if (o.copy_gbs) report["copy_bandwidth_gbs"] = *o.copy_gbs;
  if (!o.contexts.empty()) {
    report["context"] = "synthetic: the first context - prompt_tokens entries of every sequence hold random keys "
                        "and values written through the backend; the last prompt_tokens are prefilled";
  }
  return report;
}

}  // namespace

int bench_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv,
                   {"config", "model", "batch", "prompt-tokens", "gen-tokens", "out", "set", "policy", "context",
                    "copy-bandwidth-gbs"},
                   {"help"}, {"set"});
    if (cl.has("help")) {
      std::cout << kUsage;
      return 0;
    }
    ServerConfig config = load_command_config(cl);
    if (cl.has("model")) config.model.path = cl.get("model");
    const BenchOptions o = parse_bench_options(cl);
    // --context measures end mode (below): under auto its sequences run so whatever their policy.
    if (!o.contexts.empty() && config.kv_cache.prefill_compression == "auto") {
      config.kv_cache.prefill_compression = "end";
    }

    std::unique_ptr<RankRuntime> rt = make_runtime(config);
    nlohmann::json report = bench_report(command_text("bench", argc, argv), config, *rt, o);
    // Written after every result, so that a run stopped by a time limit leaves what it measured.
    auto add_result = [&](const nlohmann::json& row) {
      std::cout << row.dump() << std::endl;
      report["results"].push_back(row);
      if (!cl.has("out")) return;
      std::ofstream out(cl.get("out"));
      out << report.dump(2) << "\n";
      if (!out) throw std::runtime_error("cannot write " + cl.get("out"));
    };
    std::mt19937 rng(7);
    const std::optional<PolicySpec> request_policy =
        o.policy.empty() ? std::nullopt : std::optional<PolicySpec>(parse_policy_spec(o.policy));
    const int64_t weight_bytes = held_weight_bytes(rt->weights, *rt->backend, /*embedding=*/false);
    const BenchSetup setup{*rt, o.n_prompt, o.n_gen, request_policy, weight_bytes, o.copy_gbs, rng};
    if (!o.contexts.empty()) {
      // Its prompts start after synthetic entries and are cut by the step's token budget, not at the points
      // where a chunked prefill compresses.
      if (config.kv_cache.prefill_compression == "chunked") {
        throw std::invalid_argument("--context measures kv_cache.prefill_compression end, not chunked");
      }
      SeqId next_seq = 1;
      for (int n_context : o.contexts) {
        for (int batch : o.batches) {
          add_result(run_at_context(setup, config.engine.max_batch_tokens, next_seq, batch, n_context));
        }
      }
      return 0;
    }
    // Without a tokenizer (dummy weights) nothing ends a sequence early; with one, EOS is ignored.
    std::optional<Tokenizer> no_tokenizer_stand_in;
    if (!rt->tokenizer) no_tokenizer_stand_in.emplace(stand_in_tokenizer(rt->weights.config));
    const Tokenizer& tokenizer = rt->tokenizer ? *rt->tokenizer : *no_tokenizer_stand_in;
    const std::string effective_policy = o.policy.empty() ? config.kv_cache.policy : o.policy;
    const bool kv_estimable =
        parse_policy_spec(effective_policy).name == "full" && rt->pool->layout().quant == KvQuant::none;
    for (int batch : o.batches) {
      add_result(run_through_engine(setup, tokenizer, engine_options(config, *rt), kv_estimable, batch));
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata bench: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
