#include "kernels/cpu/amx_probe.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define STRATA_AMX_PROBE 1
#include <asm/prctl.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#else
#define STRATA_AMX_PROBE 0
#endif

namespace strata::cpu {
namespace {

#if STRATA_AMX_PROBE
// The probe's operands: C (16 x 16 int32) += A (16 x 64 u8) . B, B being 64 x 16 int8 held as AMX reads it, four
// consecutive k of a column in a row of 64 bytes: B[k][n] at byte 4n + k % 4 of row k / 4.
constexpr int kRows = 16, kRowBytes = 64;
uint8_t probe_a(int m, int k) { return uint8_t((m + 3 * k) % 7); }
int8_t probe_b(int k, int n) { return int8_t((5 * k + n) % 9 - 4); }

__attribute__((target("amx-tile,amx-int8"))) void tile_product(const uint8_t* a, const int8_t* b, int32_t* c,
                                                                int rows) {
  alignas(64) uint8_t config[64] = {};
  config[0] = 1;  // palette 1; then per tile its bytes per row (16 bits at 16 + 2t) and its rows (8 bits at 48 + t)
  for (int t = 0; t < 3; ++t) {
    config[16 + 2 * t] = kRowBytes;
    config[48 + t] = uint8_t(rows);
  }
  _tile_loadconfig(config);
  _tile_zero(0);
  _tile_loadd(1, a, kRowBytes);
  _tile_loadd(2, b, kRowBytes);
  _tile_dpbusd(0, 1, 2);
  _tile_stored(0, c, kRowBytes);
  _tile_release();
}

// Where the probing thread's handler jumps to; null on every other thread, whose signals keep their default action.
thread_local sigjmp_buf* probe_jump = nullptr;

void on_probe_signal(int signal) {
  if (probe_jump != nullptr) siglongjmp(*probe_jump, signal);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

// Runs the tile product with SIGILL and SIGSEGV caught; 0, or the signal it raised.
int tile_product_caught(const uint8_t* a, const int8_t* b, int32_t* c, int rows) {
  struct sigaction action = {}, old_ill = {}, old_segv = {};
  action.sa_handler = on_probe_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGILL, &action, &old_ill);
  sigaction(SIGSEGV, &action, &old_segv);
  sigjmp_buf jump;
  const int signal = sigsetjmp(jump, 1);
  if (signal == 0) {
    probe_jump = &jump;
    tile_product(a, b, c, rows);
  }
  probe_jump = nullptr;
  sigaction(SIGILL, &old_ill, nullptr);
  sigaction(SIGSEGV, &old_segv, nullptr);
  return signal;
}

AmxProbe probe() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool leaf7 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx);
  const bool tile = leaf7 && (edx >> 24 & 1), int8 = leaf7 && (edx >> 25 & 1);
  if (!tile || !int8) return {AmxState::absent, "the CPU does not report AMX-TILE and AMX-INT8"};
  constexpr unsigned long kXtileData = 18;  // the XSAVE feature number of the tile data
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, kXtileData) != 0) {
    return {AmxState::refused, std::string("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): ") + std::strerror(errno)};
  }
  std::string reason;
  if (!run_tile_probe(reason)) return {AmxState::trapped, reason};
  return {AmxState::usable, "a tile product ran and gave its answer"};
}
#endif

}  // namespace

bool run_tile_probe(std::string& reason, int rows) {
#if STRATA_AMX_PROBE
  alignas(64) uint8_t a[kRows * kRowBytes];
  alignas(64) int8_t b[kRows * kRowBytes];
  alignas(64) int32_t c[kRows * kRows];
  for (int m = 0; m < kRows; ++m) {
    for (int k = 0; k < kRowBytes; ++k) a[m * kRowBytes + k] = probe_a(m, k);
  }
  for (int k = 0; k < kRowBytes; ++k) {
    for (int n = 0; n < kRows; ++n) b[(k / 4) * kRowBytes + 4 * n + k % 4] = probe_b(k, n);
  }
  const int signal = tile_product_caught(a, b, c, rows);
  if (signal != 0) {
    reason = std::string("a tile instruction raised ") + (signal == SIGILL ? "SIGILL" : "SIGSEGV");
    return false;
  }
  for (int m = 0; m < kRows; ++m) {
    for (int n = 0; n < kRows; ++n) {
      int32_t expected = 0;
      for (int k = 0; k < kRowBytes; ++k) expected += int32_t(probe_a(m, k)) * probe_b(k, n);
      if (c[m * kRows + n] != expected) {
        reason = "a tile product gave " + std::to_string(c[m * kRows + n]) + " for " + std::to_string(expected);
        return false;
      }
    }
  }
  return true;
#else
  reason = "not an x86-64 Linux build";
  return false;
#endif
}

const AmxProbe& amx_probe() {
#if STRATA_AMX_PROBE
  static const AmxProbe result = probe();
#else
  static const AmxProbe result{AmxState::absent, "not an x86-64 Linux build"};
#endif
  return result;
}

std::string_view amx_state_name(AmxState state) {
  switch (state) {
    case AmxState::absent: return "absent";
    case AmxState::refused: return "refused";
    case AmxState::trapped: return "trapped";
    case AmxState::usable: return "usable";
  }
  return "unknown";
}

std::string amx_summary() {
  const AmxProbe& p = amx_probe();
  return std::string(amx_state_name(p.state)) + " (" + p.reason + ")";
}

}  // namespace strata::cpu
