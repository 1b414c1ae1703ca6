#include "leader/kv_state_view.h"

#include <algorithm>
#include <string_view>

#include <nlohmann/json.hpp>

namespace strata {
namespace {

using nlohmann::json;

template <typename T>
const T* find_seq(const std::vector<T>& sorted, int64_t seq) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), seq, [](const T& s, int64_t id) { return s.seq < id; });
  return it == sorted.end() || it->seq != seq ? nullptr : &*it;
}

// An observation as a member of `out` (cache/observation.h): a dot in its name nests it, a verdict is true or
// false. A name whose path runs into a member that is not an object ("tokens.x") is left out rather than failing
// the whole view.
void add_observation(json& out, const Observation& o) {
  json* at = &out;
  std::string_view name = o.name;
  for (size_t dot = name.find('.'); dot != std::string_view::npos; dot = name.find('.')) {
    at = &(*at)[std::string(name.substr(0, dot))];
    name.remove_prefix(dot + 1);
    if (!at->is_null() && !at->is_object()) return;
  }
  (*at)[std::string(name)] = o.kind == ObservationKind::verdict ? json(o.value != 0) : json(o.value);
}

// One sequence's layers on one stage: lengths from the scheduler's part of the report, the rest from the detail.
void add_layers(json& out, const RankReport& stage, int64_t seq) {
  const SequenceKv* kv = find_seq(stage.sequences, seq);
  const SequenceDetail* detail = find_seq(stage.details, seq);
  if (kv == nullptr) return;
  for (size_t i = 0; i < kv->entries.size(); ++i) {
    json entry = {{"layer", stage.layer_begin + int(i)}, {"tokens", kv->entries[i]}, {"blocks", kv->blocks[i]}};
    if (detail != nullptr) {
      const SequenceLayerDetail& d = detail->layers[i];
      entry["uncompressed_tokens"] = d.appended;
      if (!d.policy.empty()) entry["policy"] = d.policy;
      for (const Observation& o : d.observations) add_observation(entry, o);
    }
    out.push_back(std::move(entry));
  }
}

}  // namespace

std::string render_kv_state(const RankGrid& grid, const std::vector<RankReport>& reports,
                            const std::vector<KvStateSequence>& sequences, int64_t prefix_blocks_in_use) {
  std::vector<const RankReport*> stages;
  for (int st = 0; st < grid.pp; ++st) stages.push_back(&reports.at(size_t(grid.rank_of(st, 0))));
  int64_t held = 0, blocks_free = 0, blocks_total = 0, blocks_cached = 0;
  json layers = json::array();
  for (const RankReport* r : stages) {
    for (size_t i = 0; i < r->layers.size(); ++i) {
      const LayerUsage& u = r->layers[i].usage;
      layers.push_back({{"layer", r->layer_begin + int(i)}, {"pp_stage", r->pp_stage}, {"tokens", u.entries},
                        {"blocks", u.blocks}, {"bytes", u.bytes}, {"uncompressed_bytes", u.uncompressed_bytes}});
      // The layer's amounts; its counts are the growth since the previous report, which /metrics adds up.
      for (const Observation& o : r->layers[i].observations) {
        if (o.kind == ObservationKind::amount) add_observation(layers.back(), o);
      }
      if (u.cached_blocks) layers.back()["cached_blocks"] = u.cached_blocks;
      held += u.blocks;
      blocks_cached += u.cached_blocks;
    }
    blocks_free += r->blocks_free;
    blocks_total += r->blocks_total;
  }
  json ranks = json::array();
  for (const RankReport& r : reports) {
    ranks.push_back({{"rank", r.world_rank}, {"pp_stage", r.pp_stage}, {"tp_rank", r.tp_rank},
                     {"blocks_free", r.blocks_free}, {"blocks_total", r.blocks_total}});
  }
  json seqs = json::array();
  for (const KvStateSequence& s : sequences) {
    json per_layer = json::array();
    for (const RankReport* r : stages) add_layers(per_layer, *r, s.seq);
    seqs.push_back({{"seq", s.seq},
                    {"request", s.request},
                    {"choice", s.choice},
                    {"policy", s.policy.empty() ? "(server default)" : s.policy},
                    {"prompt_tokens", s.prompt_tokens},
                    {"generated_tokens", s.generated_tokens},
                    {"uncompressed_tokens", s.uncompressed_tokens},
                    {"prefix_blocks_shared", s.prefix_blocks_shared},
                    {"prefix_blocks_published", s.prefix_blocks_published},
                    {"prefix_compressed", s.prefix_compressed},
                    {"prefill_compression", s.chunked_prefill ? "chunked" : "end"},
                    {"layers", per_layer}});
  }
  const json state = {{"pp_stage", grid.stage()},     {"tp_rank", grid.tp_rank()},
                      {"tp", grid.tp},                {"pp", grid.pp},
                      {"block_size", stages[0]->block_size},
                      {"blocks_total", blocks_total}, {"blocks_free", blocks_free},
                      {"blocks_held", held},          {"blocks_cached", blocks_cached},
                      {"prefix_blocks_in_use", prefix_blocks_in_use},
                      {"block_bytes", stages[0]->block_bytes},
                      {"layers", layers},             {"ranks", ranks},
                      {"sequences", seqs}};
  return state.dump();
}

}  // namespace strata
