#pragma once
// The shape of a Llama-family model: everything the forward pass, the KV pool and the sharding need to know.
// Filled from GGUF metadata, a Hugging Face config.json, or a named preset (model/model_loader.h).
#include <string>

#include "kernels/rope_params.h"

namespace strata {

struct ModelConfig {
  std::string architecture = "llama";
  std::string name;            // human-readable, e.g. "SmolLM2-135M-Instruct"
  int n_layers = 0;            // total layer count (global, not per pipeline stage)
  int d_model = 0;             // hidden size
  int n_heads = 0;             // total query heads
  int n_kv_heads = 0;          // total key/value heads (GQA when < n_heads)
  int head_dim = 0;
  int d_ff = 0;                // SwiGLU intermediate size
  int vocab_size = 0;
  int max_context = 0;         // positions the model was trained for
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::interleaved;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;  // output head is token_embd

  int group_size() const { return n_heads / n_kv_heads; }  // query heads per KV head
};

}  // namespace strata
