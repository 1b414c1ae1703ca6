// How fast this machine reads memory: the yardstick of a batch-1 decode step, which reads every weight once
// ([cpu-xeon]: weight bytes read per step against this). bench/cpu_vs_llamacpp.sh runs it beside both engines.
//
//   build/bench/read_bandwidth [--threads 2] [--mib 1024] [--passes 7] [--out FILE]
//
// Each thread sums its own slice of a buffer much larger than the caches (1 GiB by default), with the widest loads
// the machine has, into independent sums; the result is the best of --passes passes (GB/s, 10^9 bytes per second), the sum printed
// so that the reads cannot be left out.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/build_commit.h"
#include "daemon/commands/machine_info.h"
#include "kernels/cpu/simd_clones.h"

namespace {

using Clock = std::chrono::steady_clock;

// 64 bytes as GCC's generic vector: one zmm under AVX-512, two ymm under AVX2, four xmm on baseline x86-64.
typedef uint64_t Words8 __attribute__((vector_size(64)));

// The sum of n 64-bit words from p (64-byte aligned, n a multiple of 32), read 64 bytes at a time into four
// independent sums; compiled for the widest loads the machine has, as the kernels it is a yardstick for are.
STRATA_SIMD_CLONES uint64_t sum_words(const uint64_t* p, size_t n) {
  const Words8* v = reinterpret_cast<const Words8*>(__builtin_assume_aligned(p, 64));
  Words8 s[4] = {};
  for (size_t i = 0; i < n / 8; i += 4) {
    for (int k = 0; k < 4; ++k) s[k] += v[i + k];
  }
  const Words8 total = s[0] + s[1] + s[2] + s[3];
  uint64_t sum = 0;
  for (int k = 0; k < 8; ++k) sum += total[k];
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, passes = 7;
  int64_t mib = 1024;
  std::string out_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::stoi(argv[i + 1]);
    else if (flag == "--mib") mib = std::stoll(argv[i + 1]);
    else if (flag == "--passes") passes = std::stoi(argv[i + 1]);
    else if (flag == "--out") out_path = argv[i + 1];
    else {
      std::cerr << "read_bandwidth: unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (threads < 1 || passes < 1 || mib < 1) {
    std::cerr << "read_bandwidth: --threads, --passes and --mib must be positive\n";
    return 2;
  }
  const size_t words = size_t(mib) << 17;  // 2^20 / 8 words per MiB
  const size_t per_thread = words / size_t(threads) / 32 * 32;
  std::vector<uint64_t> storage(words + 8);
  uint64_t* buffer = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64 / 8;
  for (size_t i = 0; i < words; ++i) buffer[i] = i;  // touched, so that every page is there before timing

  double best = 0.0;
  uint64_t checksum = 0;
  for (int pass = 0; pass < passes; ++pass) {
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    std::vector<std::thread> workers;
    const Clock::time_point start = Clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] { sums[size_t(t)] = sum_words(buffer + size_t(t) * per_thread, per_thread); });
    }
    for (std::thread& w : workers) w.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, double(per_thread * size_t(threads) * 8) / seconds / 1e9);
    for (uint64_t s : sums) checksum += s;
  }
  std::cout << "read bandwidth: " << best << " GB/s (" << threads << " threads, " << mib << " MiB, best of " << passes
            << " passes; checksum " << checksum << ")\n";
  if (!out_path.empty()) {
    std::string command = "build/bench/read_bandwidth";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    const nlohmann::json report = {{"command", command},       {"commit", strata::build_commit()},
                                   {"machine", strata::machine_json()}, {"threads", threads},
                                   {"buffer_mib", mib},        {"passes", passes},
                                   {"read_gb_per_s", best}};
    std::ofstream(out_path) << report.dump(1) << "\n";
  }
}
