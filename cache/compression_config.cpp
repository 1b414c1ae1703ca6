#include "cache/compression_config.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "cache/compression_policy.h"

namespace strata {

const PolicySpec& CompressionConfig::for_layer(int global_layer) const {
  const PolicySpec* spec = &policy;
  for (const LayerOverride& o : overrides) {
    if (global_layer >= o.first_layer && global_layer <= o.last_layer) spec = &o.policy;
  }
  return *spec;
}

bool CompressionConfig::chunked() const {
  if (chunked_where_possible) {
    throw std::logic_error("kv_cache.prefill_compression auto is decided per sequence "
                           "(CompressionConfig::for_sequence)");
  }
  return prefill_chunk > 0;
}

CompressionConfig CompressionConfig::for_sequence(const std::optional<PolicySpec>& request,
                                                  PolicyContext context) const {
  CompressionConfig resolved = *this;
  if (!chunked_where_possible) return resolved;
  resolved.chunked_where_possible = false;
  int needs_chunks = -1, lacks_form = -1;  // a layer of each kind
  bool compresses = false;
  for (int l = 0; l < context.n_layers_total; ++l) {
    context.global_layer = l;
    const PolicyTraits traits = make_policy(request ? *request : for_layer(l), context)->traits();
    if (traits.needs_chunked_prefill) needs_chunks = l;
    if (!traits.compresses_prefill_chunks) lacks_form = l;
    compresses = compresses || !traits.keeps_every_entry;
  }
  if (needs_chunks >= 0 && lacks_form >= 0) {
    const auto layer = [&](int l) {
      return (request ? *request : for_layer(l)).name + " (layer " + std::to_string(l) + ")";
    };
    throw std::invalid_argument("kv_cache.prefill_compression auto: policy " + layer(needs_chunks) +
                                " compresses prefill chunks only, and " + layer(lacks_form) +
                                " has no chunked form (docs/compression.md)");
  }
  // A sequence that keeps every entry has nothing to do at a compression point: it runs as end, as before auto.
  if (lacks_form >= 0 || !compresses) resolved.prefill_chunk = 0;
  return resolved;
}

int CompressionConfig::compression_point(int pos, int prefill_len) const {
  if (!chunked()) return prefill_len;
  return std::min(prefill_len, (pos / prefill_chunk + 1) * prefill_chunk);
}

namespace {

int parse_layer(const std::string& text, const std::string& item) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || v < 0 || v > 100000) {
    throw PolicyError("", "layer override '" + item + "': '" + text + "' is not a layer index");
  }
  return int(v);
}

}  // namespace

std::vector<LayerOverride> parse_layer_overrides(std::string_view text) {
  std::vector<LayerOverride> out;
  while (!text.empty()) {
    const size_t semi = text.find(';');
    const std::string item(text.substr(0, semi));
    text = semi == std::string_view::npos ? std::string_view() : text.substr(semi + 1);
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw PolicyError("", "layer override '" + item + "': expected LAYERS=POLICY");
    std::string layers = item.substr(0, eq);
    layers.erase(0, layers.find_first_not_of(" \t"));
    layers.erase(layers.find_last_not_of(" \t") + 1);
    LayerOverride o;
    const size_t dash = layers.find('-');
    o.first_layer = parse_layer(layers.substr(0, dash), item);
    o.last_layer = dash == std::string::npos ? o.first_layer : parse_layer(layers.substr(dash + 1), item);
    if (o.last_layer < o.first_layer) throw PolicyError("", "layer override '" + item + "': empty layer range");
    o.policy = parse_policy_spec(item.substr(eq + 1));
    validate_policy(o.policy);
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace strata
