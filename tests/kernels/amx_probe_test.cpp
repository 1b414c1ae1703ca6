// The AMX probe (kernels/cpu/amx_probe.h) against what the kernel tells /proc/cpuinfo: where the CPU reports no
// AMX the probe says absent, and its last step, a tile product forced to run anyway, traps for real and is caught,
// leaving the process able to go on (and to trap again). Where the CPU reports AMX the probe's state and its tile
// product must agree.
#include "kernels/cpu/amx_probe.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace strata::cpu {
namespace {

std::set<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string flag; words >> flag;) flags.insert(flag);
    return flags;
  }
  return {};
}

bool cpu_reports_amx() {
  const std::set<std::string> flags = cpu_flags();
  return flags.count("amx_tile") && flags.count("amx_int8");
}

TEST(AmxProbe, AbsentExactlyWhereTheCpuReportsNoAmx) {
#if !defined(__x86_64__) || !defined(__linux__)
  GTEST_SKIP() << "x86-64 Linux only";
#endif
  EXPECT_EQ(amx_probe().state == AmxState::absent, !cpu_reports_amx()) << amx_summary();
  EXPECT_FALSE(amx_probe().reason.empty());
  EXPECT_EQ(amx_summary().rfind(std::string(amx_state_name(amx_probe().state)) + " (", 0), 0u) << amx_summary();
}

TEST(AmxProbe, ATileProductWithoutAmxTrapsAndTheProcessGoesOn) {
#if !defined(__x86_64__) || !defined(__linux__)
  GTEST_SKIP() << "x86-64 Linux only";
#endif
  if (cpu_reports_amx()) GTEST_SKIP() << "the CPU reports AMX: nothing forces the trap here";
  for (int attempt = 0; attempt < 2; ++attempt) {  // the handler is restored and installed again
    std::string reason;
    EXPECT_FALSE(run_tile_probe(reason));
    EXPECT_EQ(reason, "a tile instruction raised SIGILL");
  }
}

// Where the tiles run, a configuration of 17 rows (beyond the palette's 16) makes the CPU raise a fault at the
// configuration (SIGSEGV), as an AMX build that a VM refuses meets it: the probe reports it, the process goes on,
// and a real product runs after it.
TEST(AmxProbe, AFaultingTileConfigurationIsCaughtAndTheProcessGoesOn) {
  if (!cpu_reports_amx() || amx_probe().state != AmxState::usable) {
    GTEST_SKIP() << "AMX is not usable here: " << amx_summary();
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string reason;
    EXPECT_FALSE(run_tile_probe(reason, 17));
    EXPECT_EQ(reason, "a tile instruction raised SIGSEGV");
  }
  std::string reason;
  EXPECT_TRUE(run_tile_probe(reason)) << reason;
}

TEST(AmxProbe, WhereAmxIsReportedTheStateMatchesTheTileProduct) {
  if (!cpu_reports_amx()) GTEST_SKIP() << "the CPU reports no AMX";
  const AmxProbe& probe = amx_probe();
  if (probe.state == AmxState::refused) GTEST_SKIP() << "Linux refused the tile state: " << probe.reason;
  std::string reason;
  EXPECT_EQ(run_tile_probe(reason), probe.state == AmxState::usable) << reason;
}

}  // namespace
}  // namespace strata::cpu
