// The int8 kernel in portable C++ (kernels/cpu/quantized_dot.h): the baseline x86-64 level, and the only one on
// other architectures. The same sums as quantized_dot_int8_avx2.cpp, in plain integer loops.
#include "kernels/cpu/int8_activations.h"
#include "kernels/cpu/quantized_dot.h"

namespace strata::cpu {
namespace {

inline uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Block 0 and block 1 of a pair group's codes against 64 activation values: (u . q) of each.
template <bool FourBit>
inline void group_dots(const uint8_t* payload, const int8_t* q, int32_t& dot0, int32_t& dot1) {
  dot0 = dot1 = 0;
  for (int j = 0; j < 32; ++j) {
    const int u0 = FourBit ? payload[j] & 0xF : payload[j];
    const int u1 = FourBit ? payload[j] >> 4 : payload[32 + j];
    dot0 += u0 * q[j];
    dot1 += u1 * q[32 + j];
  }
}

template <bool FourBit>
float row_dot(const uint8_t* row, const int8_t* q, const float* scales, int64_t groups) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  float sum = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* group = row + g * kGroupBytes;
    const float* s = scales + 4 * g;  // d0, d1, s0, s1
    int32_t dot0, dot1;
    group_dots<FourBit>(group + 8, q + 64 * g, dot0, dot1);
    sum += fp16_to_fp32(load_u16(group)) * s[0] * float(dot0) + fp16_to_fp32(load_u16(group + 2)) * s[1] * float(dot1) +
           fp16_to_fp32(load_u16(group + 4)) * s[2] + fp16_to_fp32(load_u16(group + 6)) * s[3];
  }
  return sum;
}

}  // namespace

void quantized_dot_int8_baseline(const PackedWeight& w, int64_t row_begin, int64_t row_end,
                                 const Int8Activations& x, float* out, int64_t out_stride) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* row = w.data + i * w.row_bytes;
    for (int64_t a = 0; a < x.rows; ++a) {
      out[a * out_stride + i] = w.layout == PackedLayout::u4_pairs
                                    ? row_dot<true>(row, x.row_values(a), x.row_scales(a), x.groups)
                                    : row_dot<false>(row, x.row_values(a), x.row_scales(a), x.groups);
    }
  }
}

}  // namespace strata::cpu
