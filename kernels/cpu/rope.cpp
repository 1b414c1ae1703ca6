// Rotary position embedding, both layouts (../shared/specs/model_format.md, section 3):
//   interleaved (GGUF llama): pairs (2i, 2i+1);   half-split (Hugging Face): pairs (i, i + d/2).
// Angles are computed as Hugging Face does (fp32 inverse frequencies, fp32 product with the position), so that
// logits far into a sequence agree with the transformers reference.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {

void rope_inv_freq(int head_dim, const RopeParams& params, float* inv_freq) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = 1.0f / std::pow(params.theta, float(2 * i) / float(head_dim));
  }
  const RopeScaling& s = params.scaling;
  if (s.factor <= 0.0f) return;
  // Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, the band between interpolated.
  const float low_wavelen = float(s.original_context) / s.low_freq_factor;
  const float high_wavelen = float(s.original_context) / s.high_freq_factor;
  for (int i = 0; i < half; ++i) {
    const float wavelen = 2.0f * float(M_PI) / inv_freq[i];
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      inv_freq[i] /= s.factor;
    } else {
      const float smooth = (float(s.original_context) / wavelen - s.low_freq_factor) /
                           (s.high_freq_factor - s.low_freq_factor);
      inv_freq[i] = (1.0f - smooth) * inv_freq[i] / s.factor + smooth * inv_freq[i];
    }
  }
}

void rope(float* x, std::span<const int32_t> positions, int n_heads, int head_dim, const RopeParams& params) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(half);
  rope_inv_freq(head_dim, params, inv_freq.data());
  const int64_t row = int64_t(n_heads) * head_dim;
  parallel_for(int64_t(positions.size()), 16, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = begin; t < end; ++t) {
      for (int i = 0; i < half; ++i) {
        const float angle = float(positions[size_t(t)]) * inv_freq[i];
        cos_v[i] = float(std::cos(double(angle)));
        sin_v[i] = float(std::sin(double(angle)));
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + t * row + int64_t(h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const int a = params.style == RopeStyle::interleaved ? 2 * i : i;
          const int b = params.style == RopeStyle::interleaved ? 2 * i + 1 : i + half;
          const float x0 = v[a], x1 = v[b];
          v[a] = x0 * cos_v[i] - x1 * sin_v[i];
          v[b] = x1 * cos_v[i] + x0 * sin_v[i];
        }
      }
    }
  });
}

}  // namespace strata::cpu
