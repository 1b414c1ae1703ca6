#pragma once
// What a layer keeps of its KV cache. One policy object serves one (request policy, layer); the engine calls its
// hooks at the end of a sequence's prefill and after each decode step, and applies a returned selection with
// KvCache::retain, which compacts the layer and returns freed blocks to the pool at once.
// [engine] ships `full`; the compression issues add the rest of the family (design brief, section 3) on this
// interface, extending PolicyNeeds and LayerState with the attention statistics they ask for.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// Attention statistics a policy asks the forward pass to compute (none for `full`).
struct PolicyNeeds {
  int observation_window = 0;     // > 0: scores of the last w queries against all keys at prefill end
  bool decode_probabilities = false;
  bool column_sums = false;
  bool pre_rope_keys = false;
};

// One (sequence, layer) at a hook.
struct LayerState {
  int global_layer = 0;
  int n_layers_total = 0;  // budgets are functions of the global index and the total (design rule 1)
  int prompt_len = 0;
  int n_entries = 0;       // entries the layer holds now
};

// The entries a layer keeps: ascending indices into its current entries.
struct Selection {
  std::vector<int32_t> kept;
};

class CompressionPolicy {
 public:
  virtual ~CompressionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual PolicyNeeds needs() const = 0;
  virtual std::optional<Selection> on_prefill_end(const LayerState& state) = 0;
  virtual std::optional<Selection> on_decode_step(const LayerState& state) = 0;
};

// The names make_policy knows.
std::vector<std::string> policy_names();
// Throws std::invalid_argument naming the policy when it is unknown.
std::unique_ptr<CompressionPolicy> make_policy(std::string_view name);

}  // namespace strata
