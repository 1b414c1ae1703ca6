// How many int8 products (unsigned x signed bytes, summed) a core of this machine can do per second: the yardstick
// of a prefill chunk's matrix products with integer activations, which their multiplies bound ([cpu-xeon]). A loop
// of independent multiply-adds on registers only, no loads: vpdpbusd on zmm (64 products) where the machine has
// AVX-512 VNNI, and on AVX2 the pair the AVX2 kernels use for it, vpmaddubsw then vpmaddwd (32 products).
//
//   build/bench/integer_product_peak [--threads 2] [--out FILE]
//
// Products per second per core (one thread alone) and in all (--threads at once); 10^9 products. Beside them, the
// rate the 16-row tile kernels reach on a prefill chunk (128 rows of x against Llama-3-8B's 4,096 x 4,096 Q4_K
// attn_q, int8 and int16, on the compute pool's threads: every core) and its share of the level's peak in all.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <immintrin.h>
#include <nlohmann/json.hpp>

#include "bench/random_weight_blocks.h"
#include "daemon/build_commit.h"
#include "daemon/commands/machine_info.h"
#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/packed_weight.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/quantized_matmul.h"

// GCC 12 takes the self-initialised _mm512_undefined_* inside its own intrinsics for uninitialised reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kIterations = 100'000'000;

// 12 chains, so that a multiply-add's latency never stalls the next; the asm keeps the operand opaque, so that the
// compiler neither folds the chains into one nor the loop away.
#define STRATA_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f,avx512vnni"))) int64_t vnni_products(int64_t iterations) {
  __m512i codes = _mm512_set1_epi8(3);
  const __m512i x = _mm512_set1_epi8(5);
#define STRATA_INIT(i) __m512i acc##i = _mm512_set1_epi32(i);
  STRATA_TWELVE(STRATA_INIT)
#undef STRATA_INIT
  for (int64_t k = 0; k < iterations; ++k) {
#define STRATA_STEP(i) acc##i = _mm512_dpbusd_epi32(acc##i, codes, x);
    STRATA_TWELVE(STRATA_STEP)
#undef STRATA_STEP
    __asm__ volatile("" : "+v"(codes));
  }
  __m512i sum = _mm512_setzero_si512();
#define STRATA_SUM(i) sum = _mm512_add_epi32(sum, acc##i);
  STRATA_TWELVE(STRATA_SUM)
#undef STRATA_SUM
  return _mm512_reduce_add_epi32(sum);
}

__attribute__((target("avx2"))) int64_t avx2_products(int64_t iterations) {
  __m256i codes = _mm256_set1_epi8(3);
  const __m256i x = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
#define STRATA_INIT(i) __m256i acc##i = _mm256_set1_epi32(i);
  STRATA_TWELVE(STRATA_INIT)
#undef STRATA_INIT
  for (int64_t k = 0; k < iterations; ++k) {
#define STRATA_STEP(i) acc##i = _mm256_add_epi32(acc##i, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), ones));
    STRATA_TWELVE(STRATA_STEP)
#undef STRATA_STEP
    __asm__ volatile("" : "+v"(codes));
  }
  __m256i sum = _mm256_setzero_si256();
#define STRATA_SUM(i) sum = _mm256_add_epi32(sum, acc##i);
  STRATA_TWELVE(STRATA_SUM)
#undef STRATA_SUM
  int32_t lanes[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), sum);
  int64_t total = 0;
  for (int32_t v : lanes) total += v;
  return total;
}

// Products per second (10^9) of `threads` threads each running `products` at once.
double giga_products_per_second(int64_t (*products)(int64_t), int products_per_instruction, int threads) {
  std::vector<std::thread> workers;
  std::vector<int64_t> sums(static_cast<size_t>(threads));
  const Clock::time_point start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] { sums[size_t(t)] = products(kIterations); });
  }
  for (std::thread& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return double(kIterations) * 12 * products_per_instruction * threads / seconds / 1e9;
}

// The tile kernel of `isa` on a prefill chunk: 10^9 products (weights x activation digits) per second, the median
// of 5 passes over 4 matrices in turn.
double tile_kernel_giga_products_per_second(strata::cpu::CpuIsa isa, int digits) {
  using namespace strata;
  constexpr int64_t kRows = 4096, kCols = 4096, kRowsOfX = 128;
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<cpu::OwnedPackedWeight> tiles;
  for (int m = 0; m < 4; ++m) {
    blocks.push_back(bench::random_weight_blocks(WeightFormat::q4_k, kRows, kCols, rng));
    tiles.push_back(cpu::pack_weight(WeightMatrix{blocks.back().data(), WeightFormat::q4_k, kRows, kCols},
                                     cpu::PairPacking::rows16));
  }
  std::vector<float> x(size_t(kRowsOfX * kCols)), x_hat(x.size()), out(size_t(kRowsOfX * kRows));
  for (float& v : x) v = std::normal_distribution<float>()(rng);
  cpu::IntegerActivations rounded;
  cpu::round_activations(x.data(), kRowsOfX, kCols, digits, rounded, x_hat.data());
  std::vector<double> seconds;
  for (int pass = 0; pass < 6; ++pass) {
    const Clock::time_point start = Clock::now();
    for (const cpu::OwnedPackedWeight& w : tiles) {
      cpu::quantized_matmul_integer(rounded, x_hat.data(), w.view, out.data(), isa);
    }
    if (pass > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());  // pass 0 warms
  }
  std::sort(seconds.begin(), seconds.end());
  return double(kRows * kCols * kRowsOfX * digits) * double(tiles.size()) / seconds[seconds.size() / 2] / 1e9;
}

}  // namespace

#pragma GCC diagnostic pop

int main(int argc, char** argv) {
  int threads = 2;
  std::string out_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::stoi(argv[i + 1]);
    else if (flag == "--out") out_path = argv[i + 1];
    else {
      std::cerr << "integer_product_peak: unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (threads < 1) {
    std::cerr << "integer_product_peak: --threads must be positive\n";
    return 2;
  }
  nlohmann::json peaks = nlohmann::json::object();
  struct Level {
    const char* name;
    strata::cpu::CpuIsa isa;
    int64_t (*products)(int64_t);
    int products_per_instruction;
  };
  for (const Level& l : {Level{"avx512_vnni vpdpbusd zmm", strata::cpu::CpuIsa::avx512_vnni, vnni_products, 64},
                         Level{"avx2 vpmaddubsw + vpmaddwd ymm", strata::cpu::CpuIsa::avx2, avx2_products, 32}}) {
    if (!strata::cpu::cpu_supports(l.isa)) continue;
    const double one = giga_products_per_second(l.products, l.products_per_instruction, 1);
    const double all = giga_products_per_second(l.products, l.products_per_instruction, threads);
    peaks[l.name] = {{"giga_products_per_second_one_core", one}, {"giga_products_per_second_all", all}};
    std::cout << l.name << ": " << one << " G products/s on one core, " << all << " on " << threads << " threads\n";
    for (int digits : {1, 2}) {
      const double tiles = tile_kernel_giga_products_per_second(l.isa, digits);
      const std::string name = digits == 2 ? "tiles_int16_128_rows" : "tiles_int8_128_rows";
      peaks[l.name][name] = {{"giga_products_per_second", tiles}, {"share_of_peak", tiles / all}};
      std::cout << "  its " << (digits == 2 ? "int16" : "int8") << " tile kernel at 128 rows of x: " << tiles
                << " G products/s, " << tiles / all << " of that\n";
    }
  }
  if (!out_path.empty()) {
    std::string command = "build/bench/integer_product_peak";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    const nlohmann::json report = {{"command", command}, {"commit", strata::build_commit()},
                                   {"machine", strata::machine_json()}, {"threads", threads}, {"peaks", peaks}};
    std::ofstream(out_path) << report.dump(1) << "\n";
  }
}
