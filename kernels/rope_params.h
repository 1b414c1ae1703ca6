#pragma once
// How RoPE rotates a head: the pairing of its dimensions, the base frequency and Llama 3.1's frequency scaling.
// The model's configuration holds them (model/model_config.h); the ops take them (kernels/backend.h).
namespace strata {

// How RoPE pairs the dimensions of a head (../shared/specs/model_format.md, section 3).
enum class RopeStyle {
  interleaved,  // pairs (2i, 2i+1): GGUF llama weights (rows of Q and K permuted by the converter)
  half_split,   // pairs (i, i + d/2): Hugging Face weights ("neox", rotate_half)
};

// Llama 3.1 style frequency scaling; factor == 0 means none.
struct RopeScaling {
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

struct RopeParams {
  RopeStyle style = RopeStyle::interleaved;
  float theta = 10000.0f;
  RopeScaling scaling;
};

}  // namespace strata
