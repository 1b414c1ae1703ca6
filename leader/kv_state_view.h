#pragma once
// The JSON of /v1/kv_state, for people who debug a deployment: the pool of every rank, every layer's occupancy
// (from the first tensor rank of each stage: its TP peers hold the same lengths), and per sequence, per layer, what
// the cache holds and what the layer's policy reports, each observation under its own name (cache/observation.h). Rendered from the reports of a step whose plan asked the
// ranks for their sequences' detail (StepPlan::report_detail), only when a client asks.
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/rank_grid.h"
#include "parallel/rank_report.h"

namespace strata {

// What the leader knows of a sequence that the ranks do not.
struct KvStateSequence {
  int64_t seq = 0;
  std::string request;  // the request's id
  int choice = 0;
  std::string policy;   // the request's policy spec; empty: the server's configuration
  int prompt_tokens = 0;
  int generated_tokens = 0;
  int uncompressed_tokens = 0;  // tokens whose KV it has computed: what each layer holds before any compression
  int prefix_blocks_shared = 0;     // cached blocks its KV started from (shared with the cache and other sequences)
  int prefix_blocks_published = 0;  // its own prompt blocks it published to the cache since
  bool prefix_compressed = false;   // the shared blocks are a compressed prefix ([shared-compressed])
  bool chunked_prefill = false;     // its prompt is compressed chunk by chunk (kv_cache.prefill_compression, decided)
};

// reports: every rank's, by world rank. Sequences the reports do not describe get no layers. "blocks_cached" is
// what the ranks report (the blocks of every layer in the prefix cache); prefix_blocks_in_use: the cached prompt
// blocks some sequence uses now, by the leader's index (each one block in every layer); 0 when nothing runs.
std::string render_kv_state(const RankGrid& grid, const std::vector<RankReport>& reports,
                            const std::vector<KvStateSequence>& sequences, int64_t prefix_blocks_in_use);

}  // namespace strata
