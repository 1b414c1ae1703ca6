#pragma once
// The weights of one rank's shard: a layer range [layer_begin, layer_end) and, under tensor parallelism, a slice
// of the heads and of the MLP. Each matrix is in the format model.weight_dtype asks for (WeightDtype): a tensor
// kept in the file's format is used in place in the mapped file (no copy); the others are converted once.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/weight_format.h"
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

// model.weight_dtype: the formats the matrices are kept in.
enum class WeightDtype {
  automatic,  // "auto": each tensor in its file's format where the kernels have one (f32, f16, bf16, q8_0, q4_0,
              // q4_1, q4_k, q5_k, q6_k, q5_1); q5_0 as q8_0 (the same values); f32 for the others and for a slice
              // that splits blocks
  f32,        // every matrix dequantized to fp32: the reference path
  q8_0,       // every matrix in Q8_0 (requantized from the file's values unless already Q8_0; Q5_0 converted exactly)
  f16,        // every matrix in IEEE half (an F16 tensor as it is; the others rounded to nearest even)
  bf16,       // every matrix in bfloat16 (a BF16 tensor as it is; the others rounded to nearest even)
};

// "auto", "f32", "q8_0", "f16", "bf16"; std::invalid_argument listing them otherwise.
WeightDtype parse_weight_dtype(const std::string& name);

struct LayerWeights {
  int layer = 0;              // global layer index
  WeightMatrix attn_norm;       // [1, d_model]
  WeightMatrix wq;              // [n_heads_local * head_dim, d_model]   column-parallel
  WeightMatrix wk;              // [n_kv_heads_local * head_dim, d_model]
  WeightMatrix wv;              // [n_kv_heads_local * head_dim, d_model]
  WeightMatrix wo;              // [d_model, n_heads_local * head_dim]   row-parallel
  WeightMatrix ffn_norm;        // [1, d_model]
  WeightMatrix w_gate;          // [d_ff_local, d_model]                 column-parallel
  WeightMatrix w_up;            // [d_ff_local, d_model]
  WeightMatrix w_down;          // [d_model, d_ff_local]                 row-parallel
};

struct ModelWeights {
  ModelConfig config;
  ShardSpec shard;
  WeightMatrix token_embd;      // [vocab_size, d_model]  (when shard.has_embedding or tied output)
  WeightMatrix output_norm;     // [1, d_model]           (when shard.has_output)
  WeightMatrix output;          // [vocab_local, d_model] (when shard.has_output; aliases token_embd if tied)
  int64_t output_vocab_begin = 0;  // first vocabulary row of `output` (vocabulary-parallel head under TP)
  std::vector<LayerWeights> layers;  // layers[i].layer == shard.layer_begin + i

  // Storage that the WeightMatrix pointers above point into.
  std::vector<std::unique_ptr<uint8_t[]>> owned;
  std::shared_ptr<const void> keep_alive;  // e.g. the mapped file whose F32 tensors are used in place

  const LayerWeights& layer(int global_layer) const { return layers.at(global_layer - shard.layer_begin); }
};

}  // namespace strata
