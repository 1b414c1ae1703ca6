#pragma once
// The fp32 weights of one rank's shard: a layer range [layer_begin, layer_end) and, under tensor parallelism,
// a slice of the heads and of the MLP. Weights are read from the mapped file and dequantized once; F32 tensors
// in the file are used in place (no second copy).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace strata {

class MappedFile;

// Which part of the model one rank holds.
struct ShardSpec {
  int layer_begin = 0;
  int layer_end = -1;  // exclusive; -1 = up to the last layer
  int tp_rank = 0;
  int tp_size = 1;
  bool has_embedding = true;  // first pipeline stage
  bool has_output = true;     // last pipeline stage: output_norm and the output head

  int resolved_layer_end(const ModelConfig& c) const { return layer_end < 0 ? c.n_layers : layer_end; }
};

// A row-major fp32 matrix [rows, cols]. Linear weights are [out_features, in_features]: y[o] = dot(row o, x).
struct HostMatrix {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t size() const { return rows * cols; }
};

struct LayerWeights {
  int layer = 0;              // global layer index
  HostMatrix attn_norm;       // [1, d_model]
  HostMatrix wq;              // [n_heads_local * head_dim, d_model]   column-parallel
  HostMatrix wk;              // [n_kv_heads_local * head_dim, d_model]
  HostMatrix wv;              // [n_kv_heads_local * head_dim, d_model]
  HostMatrix wo;              // [d_model, n_heads_local * head_dim]   row-parallel
  HostMatrix ffn_norm;        // [1, d_model]
  HostMatrix w_gate;          // [d_ff_local, d_model]                 column-parallel
  HostMatrix w_up;            // [d_ff_local, d_model]
  HostMatrix w_down;          // [d_model, d_ff_local]                 row-parallel
};

struct ModelWeights {
  ModelConfig config;
  ShardSpec shard;
  HostMatrix token_embd;      // [vocab_size, d_model]  (when shard.has_embedding or tied output)
  HostMatrix output_norm;     // [1, d_model]           (when shard.has_output)
  HostMatrix output;          // [vocab_local, d_model] (when shard.has_output; aliases token_embd if tied)
  int64_t output_vocab_begin = 0;  // first vocabulary row of `output` (vocabulary-parallel head under TP)
  std::vector<LayerWeights> layers;  // layers[i].layer == shard.layer_begin + i

  // Storage that the HostMatrix pointers above point into.
  std::vector<std::unique_ptr<float[]>> owned;
  std::shared_ptr<const void> keep_alive;  // e.g. the mapped file whose F32 tensors are used in place

  const LayerWeights& layer(int global_layer) const { return layers.at(global_layer - shard.layer_begin); }
};

}  // namespace strata
