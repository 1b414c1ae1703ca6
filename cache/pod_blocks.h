#pragma once
// PoD's layer blocks (../shared/specs/pod.md §3, docs/compression.md "PoD"): for every KV head, consecutive layers
// grouped into blocks whose non-lowest layers ("followers") reuse the lowest layer's ("leader's") attention logits
// over distant tokens. Found offline by `strata calibrate` from the similarity of attention between layers and
// written to a small text file that the configuration names (kv_cache.pod_blocks):
//
//   # any comment
//   model SmolLM2-135M-Instruct
//   layers 30
//   kv_heads 3
//   threshold 0.62
//   head 0: 0-3 4-9 10 11-29        one line per KV head (global index): its blocks, ascending, covering 0..L-1
//
// Distributed rules (design brief section 4): a block never crosses a pipeline-stage boundary, so a follower's
// leader is always on its own stage; blocks are per KV head and tensor parallelism splits whole KV heads (with
// their query heads), so a rank needs only its own heads' blocks and the leader's logits never leave the rank.
#include <string>
#include <vector>

namespace strata {

struct PodBlocks {
  std::string model;   // the model it was calibrated on (a mismatch is an error)
  int n_layers = 0;
  int n_kv_heads = 0;
  double threshold = 0.0;  // δ: a layer joins a block when its similarity to every layer in it is >= δ
  // leader[h][l]: the leader of layer l's block for KV head h (l itself for a leader).
  std::vector<std::vector<int>> leader;

  bool is_leader(int kv_head, int layer) const { return leader[size_t(kv_head)][size_t(layer)] == layer; }
  int n_blocks(int kv_head) const;
  // Layers whose every KV head in [head_begin, head_end) is a follower: the layers whose distant keys a rank
  // holding those heads frees (docs/compression.md, "PoD storage").
  bool all_followers(int layer, int head_begin, int head_end) const;
};

// Similarity between layers as the spec reads it: sim = 1 - JS2(p, q), the Jensen–Shannon divergence with base-2
// logarithms, so 0 <= sim <= 1 and sim = 1 for identical rows. p and q are probability rows of equal length.
double js_similarity(const float* p, const float* q, int n);

// Algorithm 1 (greedy, bottom-up, complete linkage) for one head: similarity[a][b] for layers a, b; a layer joins
// the current block when its similarity to every layer already in the block is >= delta; a layer in
// `forced_starts` (the first layer of a pipeline stage) always opens a block. Returns leader[l].
std::vector<int> group_layers(const std::vector<std::vector<double>>& similarity, double delta,
                              const std::vector<int>& forced_starts = {});

// The first layer of every pipeline stage but the first (parallel/rank_grid.h's split).
std::vector<int> stage_starts(int n_layers, int pp);

// The asymptotic share of a rank's KV memory that PoD frees (long sequences, distant tokens only): the layers whose
// KV heads [head_begin, head_end) are all followers drop their distant keys, half of their memory, so
// (such layers) / (2 L).
double pod_asymptotic_saving(const PodBlocks& blocks, int head_begin, int head_end);

// Text form above. read throws std::runtime_error naming the file, the line and the key.
std::string format_pod_blocks(const PodBlocks& blocks);
PodBlocks read_pod_blocks(const std::string& path);
void write_pod_blocks(const std::string& path, const PodBlocks& blocks);

// Throws std::runtime_error naming the file and the key when the blocks do not fit the model (name, layers, KV
// heads) or a block crosses a stage boundary of `pp` stages.
void check_pod_blocks(const PodBlocks& blocks, const std::string& path, const std::string& model_name, int n_layers,
                      int n_kv_heads, int pp);

}  // namespace strata
