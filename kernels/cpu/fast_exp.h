#pragma once
// exp for the vectorised loops of the CPU backend (softmax, SiLU), where libm's expf stays a call per element.
#include <bit>
#include <cstdint>

namespace strata::cpu {

// exp(x) for x <= 0, written so that it vectorizes: x = n ln2 + r with |r| <= ln2 / 2, exp(r) from its Taylor
// series to r^7, and 2^n put into the exponent bits. On [-87, 0] it is within 1.1e-7 of exp relatively (about
// one float rounding); below -87 it returns exp(-87), where the true value is under float's normal range anyway.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
  // x = max(x, -87) on the bits: for x <= 0 (and +0) the bits read as unsigned grow with |x|. GCC vectorizes
  // this integer select but not a float one (a float compare may trap; std::fmax stays a library call).
  const uint32_t bits = std::bit_cast<uint32_t>(x), limit = std::bit_cast<uint32_t>(-87.0f);
  x = std::bit_cast<float>(bits < limit ? bits : limit);
  const int n = int(x * kLog2e - 0.5f);  // truncation toward zero of a negative value: round to nearest
  const float r = (x - float(n) * kLn2Hi) - float(n) * kLn2Lo;
  float e = 1.0f / 5040.0f;
  e = e * r + 1.0f / 720.0f;
  e = e * r + 1.0f / 120.0f;
  e = e * r + 1.0f / 24.0f;
  e = e * r + 1.0f / 6.0f;
  e = e * r + 0.5f;
  e = e * r + 1.0f;
  e = e * r + 1.0f;
  return e * std::bit_cast<float>(int32_t(n + 127) << 23);
}

}  // namespace strata::cpu
