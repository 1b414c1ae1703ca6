// strata calibrate: PoD's offline layer grouping (../shared/specs/pod.md §3; docs/compression.md "PoD").
// Runs the dense model over samples of a calibration text; for the last `rows` tokens of each sample, takes every
// layer's full causal attention rows per query head (the attention op's per-row probabilities, one decode step
// at a time); measures sim = 1 - JS2 between every pair of layers, averaged over samples, rows and the query heads
// of each KV head; groups consecutive layers per KV head with Algorithm 1, never across a stage boundary of
// --pp; and writes the blocks file that kv_cache.pod_blocks names. The threshold δ is either given or the highest
// one whose blocks free at least --target-saving of the KV memory (asymptotically; the spec's advice not to trust
// the paper's 0.5 on another model).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "cache/pod_blocks.h"
#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/runtime.h"

namespace strata {
namespace {

using Matrix = std::vector<std::vector<double>>;

// sim[h][a][b] for KV head h, layers a and b, from `rows` attention rows of one sample per layer.
void add_sample(RankRuntime& rt, std::span<const int32_t> tokens, int rows, std::vector<Matrix>& sim) {
  LlamaModel& model = *rt.model;
  KvCache& cache = *rt.cache;
  const int n_layers = model.config().n_layers, n_heads = model.n_heads_local();
  const int group = n_heads / model.n_kv_heads_local();
  const SeqId seq = 1;
  std::vector<float> logits;
  const int n_prefix = int(tokens.size()) - rows;
  for (int at = 0; at < n_prefix; at += 256) {  // prefill chunks of 256 tokens bound the step's scratch
    const int n = std::min(256, n_prefix - at);
    BatchSequence s{seq, tokens.subspan(size_t(at), size_t(n)), at, LogitsMode::none, nullptr};
    model.forward({&s, 1}, cache, logits);
  }
  for (int r = 0; r < rows; ++r) {
    const int pos = n_prefix + r;
    AttentionStats stats;
    stats.stride = pos + 1;
    stats.rows_from.assign(size_t(n_layers), pos);
    stats.sums.assign(size_t(n_layers), std::vector<float>(size_t(n_heads) * size_t(pos + 1), 0.0f));
    BatchSequence s{seq, tokens.subspan(size_t(pos), 1), pos, LogitsMode::none, &stats};
    model.forward({&s, 1}, cache, logits);
    for (int a = 0; a < n_layers; ++a) {
      for (int b = a + 1; b < n_layers; ++b) {
        for (int h = 0; h < n_heads; ++h) {
          const double v = js_similarity(stats.sums[size_t(a)].data() + size_t(h) * size_t(pos + 1),
                                         stats.sums[size_t(b)].data() + size_t(h) * size_t(pos + 1), pos + 1);
          sim[size_t(h / group)][size_t(a)][size_t(b)] += v;
          sim[size_t(h / group)][size_t(b)][size_t(a)] += v;
        }
      }
    }
  }
  cache.release(seq);
}

PodBlocks group_all(const std::vector<Matrix>& sim, double delta, const std::vector<int>& starts,
                    const std::string& model, bool per_layer) {
  PodBlocks b;
  b.model = model;
  b.n_kv_heads = int(sim.size());
  b.n_layers = int(sim[0].size());
  b.threshold = delta;
  Matrix mean(size_t(b.n_layers), std::vector<double>(size_t(b.n_layers), 0.0));
  for (const Matrix& m : sim) {
    for (int a = 0; a < b.n_layers; ++a) {
      for (int c = 0; c < b.n_layers; ++c) mean[size_t(a)][size_t(c)] += m[size_t(a)][size_t(c)] / double(sim.size());
    }
  }
  for (const Matrix& m : sim) b.leader.push_back(group_layers(per_layer ? mean : m, delta, starts));
  return b;
}

// The blocks of the highest δ that frees at least `target` of the KV memory, if one does. Candidates: every measured
// similarity (a higher δ merges less).
std::optional<PodBlocks> group_for_target_saving(const std::vector<Matrix>& sim, double target, const std::vector<int>& starts,
                                  const std::string& model, bool per_layer) {
  const int n_layers = int(sim[0].size()), n_kv_heads = int(sim.size());
  std::set<double, std::greater<>> candidates;
  for (const Matrix& m : sim) {
    for (int a = 0; a < n_layers; ++a) {
      for (int b = a + 1; b < n_layers; ++b) candidates.insert(m[size_t(a)][size_t(b)]);
    }
  }
  for (double d : candidates) {
    PodBlocks blocks = group_all(sim, d, starts, model, per_layer);
    if (pod_asymptotic_saving(blocks, 0, n_kv_heads) >= target) return blocks;
  }
  return std::nullopt;
}

// The calibration text's tokens; at least samples x length of them.
std::vector<int32_t> read_calibration_tokens(const std::string& path, const Tokenizer& tokenizer, int samples,
                                             int length) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read the calibration text");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = tokenizer.encode(text.str(), false);
  if (int64_t(ids.size()) < int64_t(samples) * length) {
    throw std::invalid_argument(path + ": " + std::to_string(ids.size()) + " tokens, fewer than --samples x --length");
  }
  return ids;
}

// sim[h][a][b]: the similarity of layers a and b for KV head h, averaged over `samples` consecutive pieces of
// `length` tokens, their last `rows` rows and the head's query heads; 1 on the diagonal.
std::vector<Matrix> measure_similarity(RankRuntime& rt, std::span<const int32_t> ids, int samples, int length,
                                       int rows) {
  const ModelConfig& mc = rt.weights.config;
  std::vector<Matrix> sim(size_t(mc.n_kv_heads), Matrix(size_t(mc.n_layers), std::vector<double>(size_t(mc.n_layers), 0.0)));
  for (int s = 0; s < samples; ++s) {
    add_sample(rt, ids.subspan(size_t(s) * size_t(length), size_t(length)), rows, sim);
    std::cerr << "calibrate: sample " << s + 1 << "/" << samples << " measured\n";
  }
  const double per_head_rows = double(samples) * rows * (mc.n_heads / mc.n_kv_heads);
  for (Matrix& m : sim) {
    for (int a = 0; a < mc.n_layers; ++a) {
      for (int b = 0; b < mc.n_layers; ++b) m[size_t(a)][size_t(b)] = a == b ? 1.0 : m[size_t(a)][size_t(b)] / per_head_rows;
    }
  }
  return sim;
}

// Adjacent-layer similarity per KV head on stderr, in percent, for the record.
void print_adjacent_similarity(const std::vector<Matrix>& sim) {
  for (size_t h = 0; h < sim.size(); ++h) {
    std::cerr << "sim(l, l+1) head " << h << ":";
    for (size_t l = 0; l + 1 < sim[h].size(); ++l) std::cerr << " " << int(sim[h][l][l + 1] * 100 + 0.5);
    std::cerr << " (%)\n";
  }
}

}  // namespace

int calibrate_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv,
                   {"config", "text", "out", "samples", "length", "rows", "threshold", "target-saving", "pp",
                    "granularity", "set"},
                   {"help"}, {"set"});
    if (cl.has("help") || !cl.has("text") || !cl.has("out")) {
      std::cout << "usage: strata calibrate --config FILE --text FILE --out BLOCKS [--samples 2] [--length 1024]\n"
                   "                       [--rows 16] [--threshold D | --target-saving 0.25] [--pp P]\n"
                   "                       [--granularity layer|kv_head] [--set section.key=value]...\n"
                   "  PoD's layer blocks: similarity of attention between layers (1 - JS2) over the last --rows\n"
                   "  tokens of --samples pieces of --length tokens of the text, greedy grouping per KV head at\n"
                   "  threshold D (or the highest D that frees --target-saving of the KV memory), never across the\n"
                   "  boundary of --pp stages. granularity layer (default) groups on the similarity averaged over\n"
                   "  the KV heads, so that whole layers follow and free their distant keys; kv_head groups each\n"
                   "  head on its own (a layer frees keys only where all its heads follow; docs/compression.md).\n";
      return cl.has("help") ? 0 : 2;
    }
    ServerConfig config = load_command_config(cl);
    config.kv_cache.policy = "full";
    config.kv_cache.layer_overrides = "";
    config.kv_cache.pod_blocks = "";
    config.parallel.tp = config.parallel.pp = 1;  // one process measures the whole model
    std::unique_ptr<RankRuntime> rt = make_runtime(config);
    if (!rt->tokenizer) throw std::runtime_error("calibrate: the model has no tokenizer");
    const int samples = cl.get_int("samples", 2), length = cl.get_int("length", 1024), rows = cl.get_int("rows", 16);
    const int pp = cl.get_int("pp", 1);
    const std::string granularity = cl.get("granularity", "layer");
    if (granularity != "layer" && granularity != "kv_head") {
      throw std::invalid_argument("--granularity: expected layer or kv_head, got '" + granularity + "'");
    }
    if (samples < 1 || rows < 1 || length <= rows) throw std::invalid_argument("--samples, --rows >= 1, --length > --rows");

    const std::vector<int32_t> ids = read_calibration_tokens(cl.get("text"), *rt->tokenizer, samples, length);
    const std::vector<Matrix> sim = measure_similarity(*rt, ids, samples, length, rows);
    const ModelConfig& mc = rt->weights.config;
    const std::vector<int> starts = stage_starts(mc.n_layers, pp);
    const bool per_layer = granularity == "layer";
    const std::optional<PodBlocks> blocks =
        cl.has("threshold")
            ? group_all(sim, cl.get_double("threshold", 0.5), starts, rt->model_name, per_layer)
            : group_for_target_saving(sim, cl.get_double("target-saving", 0.25), starts, rt->model_name, per_layer);
    if (!blocks) throw std::runtime_error("--target-saving " + cl.get("target-saving") + " is out of reach");
    write_pod_blocks(cl.get("out"), *blocks);
    std::cerr << format_pod_blocks(*blocks) << "calibrate: asymptotic KV saving "
              << pod_asymptotic_saving(*blocks, 0, mc.n_kv_heads) << " (layers whose every KV head follows free their "
              << "distant keys); wrote " << cl.get("out") << "\n";
    print_adjacent_similarity(sim);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata calibrate: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
