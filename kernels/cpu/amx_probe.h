#pragma once
// Whether this process may run AMX tile instructions (Intel from Sapphire Rapids), asked once, in the three steps
// a machine can fail at ([cpu-xeon]):
//   absent   the CPU does not report AMX-TILE and AMX-INT8 (CPUID leaf 7);
//   refused  Linux does not grant the tile data state to the process (arch_prctl(ARCH_REQ_XCOMP_PERM,
//            XTILEDATA) fails: a kernel before 5.16, or one that does not enable the state);
//   trapped  granted, but a probe tile product raises a signal: a VM has been seen to report AMX and trap its tile
//            instructions (llama.cpp's AMX build crashed there on batched work), so the probe runs one under a
//            signal handler before anything relies on it;
//   usable   the probe's product ran and gave its answer.
// Where it is usable the CPU kernels' best level is `amx` (kernels/cpu/quantized_dot_amx.cpp); elsewhere the
// AVX-512 VNNI tiles multiply. The probe's answer is printed where results are read: `strata --version`, the
// start-up line, strata_build_info{amx}, machine.amx in bench and eval JSON.
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::cpu {

enum class AmxState : uint8_t { absent, refused, trapped, usable };

struct AmxProbe {
  AmxState state = AmxState::absent;
  std::string reason;  // why, in words (the failing step, its errno text or signal)
};

// The probe's result for this process: probed at the first call, the same afterwards.
const AmxProbe& amx_probe();
std::string_view amx_state_name(AmxState state);
// "absent (the CPU reports no AMX-TILE/AMX-INT8)": the state and its reason, as reports print it.
std::string amx_summary();

// The probe's last step alone, whatever CPUID says: a tile product under a SIGILL/SIGSEGV handler, its tiles
// configured with `rows` rows (16; more than 16 is a configuration the CPU refuses, as llama.cpp's AMX build met on
// an AMX VM, which made it crash). True if it ran and gave its answer; false with the signal (or the wrong answer)
// in `reason`, the process unharmed. The tests run it where the CPU has no AMX, and with 17 rows where it has, so
// that the trap is taken for real either way.
bool run_tile_probe(std::string& reason, int rows = 16);

}  // namespace strata::cpu
