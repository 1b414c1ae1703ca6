// Which level of the quantized dot products this machine runs (kernels/cpu/quantized_dot.h).
#include "kernels/cpu/quantized_dot.h"

#include <algorithm>
#include <atomic>

#include "kernels/cpu/amx_probe.h"
#include "kernels/cpu/weight_prefetch.h"

namespace strata::cpu {

bool cpu_supports(CpuIsa isa) {
#if STRATA_QUANTIZED_DOT_X86
  switch (isa) {
    case CpuIsa::baseline: return true;
    case CpuIsa::avx2: return __builtin_cpu_supports("x86-64-v3");
    case CpuIsa::avx512: return __builtin_cpu_supports("x86-64-v4");  // AVX-512 F, BW, DQ, VL besides v3
    case CpuIsa::avx512_vnni: return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512vnni");
    case CpuIsa::amx: return cpu_supports(CpuIsa::avx512_vnni) && amx_probe().state == AmxState::usable;
  }
  return false;
#else
  return isa == CpuIsa::baseline;
#endif
}

namespace {
std::atomic<CpuIsa> isa_limit{CpuIsa::amx};
}  // namespace

WeightPrefetch decode_prefetch(WeightPrefetch elsewhere) {
#if STRATA_QUANTIZED_DOT_X86
  static const bool intel = [] {
    __builtin_cpu_init();  // a static initializer may run before the one that would have called it
    return __builtin_cpu_is("intel");
  }();
  return intel ? WeightPrefetch::far : elsewhere;
#else
  return elsewhere;
#endif
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = cpu_supports(CpuIsa::amx)           ? CpuIsa::amx
                             : cpu_supports(CpuIsa::avx512_vnni) ? CpuIsa::avx512_vnni
                             : cpu_supports(CpuIsa::avx512)      ? CpuIsa::avx512
                             : cpu_supports(CpuIsa::avx2)        ? CpuIsa::avx2
                                                                 : CpuIsa::baseline;
  return std::min(best, isa_limit.load());
}

void limit_cpu_isa(CpuIsa most) { isa_limit = most; }

bool cpu_isa_from_name(std::string_view name, CpuIsa& isa) {
  for (CpuIsa level : kCpuIsas) {
    if (cpu_isa_name(level) == name) {
      isa = level;
      return true;
    }
  }
  return false;
}

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline: return "baseline";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx512_vnni: return "avx512_vnni";
    case CpuIsa::amx: return "amx";
  }
  return "unknown";
}

QuantizedDotFn quantized_dot(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline: return quantized_dot_baseline;
#if STRATA_QUANTIZED_DOT_X86
    case CpuIsa::avx2: return quantized_dot_avx2;
    case CpuIsa::avx512:
    case CpuIsa::avx512_vnni:
    case CpuIsa::amx: return quantized_dot_avx512;  // VNNI and AMX multiply integers: the fp32 kernels are AVX-512's
#endif
    default: return nullptr;
  }
}

QuantizedDotInt8Fn quantized_dot_int8(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline: return quantized_dot_int8_baseline;
#if STRATA_QUANTIZED_DOT_X86
    case CpuIsa::avx2:
    case CpuIsa::avx512: return quantized_dot_int8_avx2;
    case CpuIsa::avx512_vnni: return quantized_dot_int8_avx512_vnni;
    case CpuIsa::amx: return quantized_dot_int8_amx;
#endif
    default: return nullptr;
  }
}

}  // namespace strata::cpu
