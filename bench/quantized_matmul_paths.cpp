// The two paths of the CPU backend's quantized matmul (kernels/cpu/quantized_matmul.h), timed on SmolLM2's
// matrices (random blocks of their formats and shapes) at rows of x from 1 to 128: the fused kernels, which
// dequantize in registers, against fp32 BLAS on dequantized tiles. The row count where the tiles become faster is
// kDequantizedTileMinRows (docs/decisions.md).
//
//   build/bench/quantized_matmul_paths [--reps 30] [--out bench/results/cpu-quantized-matmul-paths.json]
//   build/bench/quantized_matmul_paths --int8 [--reps 30] [--out FILE] [--only MATRIX_NAME_PART]
//
// Without --out it only prints (a run that wrote the committed results by default once overwrote them).
//
// Each (shape, rows, path) takes the median of --reps timings of 16 matrices in turn, so that the weights come
// from memory as in a real step; on the compute pool's threads (every core). With --int8 it times instead the
// integer kernels (engine.activation_dtype: int8) of every level the machine has on the pair layouts, and the AVX2,
// VNNI and AMX kernels on the 16-row tiles where the machine has them, with int8 and with int16 (two digits), at 1
// to 128 rows of x (and from 16 rows BLAS on the dequantized tiles), beside the best level's and AVX2's fp32 fused
// kernels (engine.activation_dtype: f32) below 32 rows; and Q4_K, Q5_K and Q6_K at Llama-3-8B's shapes (SmolLM2's rows
// are not multiples of 256), in place (the fp32 kernels) and as 16-row tiles.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/random_weight_blocks.h"
#include "daemon/build_commit.h"
#include "daemon/commands/machine_info.h"
#include "kernels/cpu/packed_weight.h"
#include "kernels/cpu/quantized_matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  WeightFormat format;
  int64_t rows, cols;
};

std::vector<uint8_t> random_blocks(const Shape& s, std::mt19937& rng) {
  return bench::random_weight_blocks(s.format, s.rows, s.cols, rng);
}

double median_seconds(int reps, const std::function<void()>& run) {
  std::vector<double> t;
  run();  // warm-up
  for (int i = 0; i < reps; ++i) {
    const Clock::time_point start = Clock::now();
    run();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The int8 kernels at 1 to 128 rows of x: every level on the pairs, the VNNI level on the 16-row tiles, and from 16
// rows BLAS on the dequantized tiles.
nlohmann::json time_int8_kernels(const Shape& s, std::mt19937& rng, int reps) {
  constexpr int kMatrices = 16;
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<cpu::OwnedPackedWeight> pairs, tiles;
  for (int m = 0; m < kMatrices; ++m) {
    blocks.push_back(random_blocks(s, rng));
    const WeightMatrix w{blocks.back().data(), s.format, s.rows, s.cols};
    pairs.push_back(cpu::pack_weight(w));
    tiles.push_back(cpu::pack_weight(w, cpu::PairPacking::rows16));
  }
  struct Variant {
    std::string name;
    cpu::CpuIsa isa;
    const std::vector<cpu::OwnedPackedWeight>* weights;
    int digits;  // 0: the fp32 fused kernel on x as it is
  };
  std::vector<Variant> variants;
  const bool k_quant =
      s.format == WeightFormat::q4_k || s.format == WeightFormat::q5_k || s.format == WeightFormat::q6_k;
  const char* untiled = k_quant ? " in place" : " pairs";
  variants.push_back({std::string(cpu::cpu_isa_name(cpu::best_cpu_isa())) + untiled + " fp32", cpu::best_cpu_isa(),
                      &pairs, 0});
  if (cpu::best_cpu_isa() > cpu::CpuIsa::avx2 && cpu::cpu_supports(cpu::CpuIsa::avx2)) {  // an AVX2 machine's default
    variants.push_back({std::string("avx2") + untiled + " fp32", cpu::CpuIsa::avx2, &pairs, 0});
  }
  for (cpu::CpuIsa isa : {cpu::CpuIsa::avx2, cpu::CpuIsa::avx512_vnni}) {
    if (cpu::cpu_supports(isa)) variants.push_back({std::string(cpu::cpu_isa_name(isa)) + untiled, isa, &pairs, 1});
  }
  if (cpu::cpu_supports(cpu::CpuIsa::avx2) && s.format != WeightFormat::q8_0) {  // Q8_0 stays in pairs on AVX2
    variants.push_back({"avx2 rows16", cpu::CpuIsa::avx2, &tiles, 1});
    variants.push_back({"avx2 rows16 int16", cpu::CpuIsa::avx2, &tiles, 2});
  }
  for (cpu::CpuIsa isa : {cpu::CpuIsa::avx512_vnni, cpu::CpuIsa::amx}) {
    if (!cpu::cpu_supports(isa)) continue;
    variants.push_back({std::string(cpu::cpu_isa_name(isa)) + " rows16", isa, &tiles, 1});
    variants.push_back({std::string(cpu::cpu_isa_name(isa)) + " rows16 int16", isa, &tiles, 2});
  }
  nlohmann::json results = nlohmann::json::array();
  for (int64_t rows : {1, 2, 4, 8, 16, 32, 64, 128}) {
    std::vector<float> x(size_t(rows * s.cols)), x_hat(x.size()), out(size_t(rows * s.rows));
    for (float& v : x) v = std::normal_distribution<float>()(rng);
    cpu::IntegerActivations rounded[2];
    std::vector<float> x_hat16(x.size());
    cpu::round_activations(x.data(), rows, s.cols, 1, rounded[0], x_hat.data());
    cpu::round_activations(x.data(), rows, s.cols, 2, rounded[1], x_hat16.data());
    if (rows >= 16) {  // what quantized_matmul runs from kDequantizedTileMinRows rows: BLAS on dequantized tiles
      const double seconds = median_seconds(reps, [&] {
        for (const cpu::OwnedPackedWeight& p : tiles) cpu::quantized_matmul_tiles(x_hat.data(), rows, p.view, out.data());
      }) / kMatrices;
      results.push_back({{"matrix", s.name}, {"rows_of_x", rows}, {"kernel", "fp32 tiles (BLAS)"},
                         {"us", seconds * 1e6}, {"weight_gb_per_s", double(s.rows * tiles[0].view.row_bytes) / seconds / 1e9}});
      std::cout << s.name << ", " << rows << " rows, fp32 tiles (BLAS): " << seconds * 1e6 << " us\n";
    }
    for (const Variant& v : variants) {
      if (v.digits == 0 && rows >= cpu::kDequantizedTileMinRows) continue;  // the fp32 tiles, above
      const double seconds = median_seconds(reps, [&] {
        for (const cpu::OwnedPackedWeight& p : *v.weights) {
          if (v.digits == 0) {
            cpu::quantized_matmul_fused(x.data(), rows, p.view, out.data(), v.isa);
          } else {
            cpu::quantized_matmul_integer(rounded[v.digits - 1], v.digits == 2 ? x_hat16.data() : x_hat.data(),
                                          p.view, out.data(), v.isa);
          }
        }
      }) / kMatrices;
      results.push_back({{"matrix", s.name}, {"rows_of_x", rows}, {"kernel", v.name}, {"us", seconds * 1e6},
                         {"weight_gb_per_s", double(s.rows * (*v.weights)[0].view.row_bytes) / seconds / 1e9}});
      std::cout << s.name << ", " << rows << " rows, " << v.name << ": " << seconds * 1e6 << " us\n";
    }
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30;
  std::string out_path;
  bool int8 = false;
  std::string only;  // times only the matrices whose name holds it
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--int8") int8 = true;
    else if (flag == "--only" && i + 1 < argc) only = argv[++i];
    else if (flag == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (flag == "--out" && i + 1 < argc) out_path = argv[++i];
  }
  std::vector<Shape> shapes = {{"ffn_up q4_1", WeightFormat::q4_1, 1536, 576},
                               {"ffn_down q4_1", WeightFormat::q4_1, 576, 1536},
                               {"output q8_0 (4,096 of the 49,152 rows)", WeightFormat::q8_0, 4096, 576}};
  if (int8) {
    shapes.push_back({"attn_q q4_k (Llama-3-8B)", WeightFormat::q4_k, 4096, 4096});
    shapes.push_back({"ffn_down q4_k (Llama-3-8B)", WeightFormat::q4_k, 4096, 14336});
    shapes.push_back({"attn_q q5_k (Llama-3-8B)", WeightFormat::q5_k, 4096, 4096});
    shapes.push_back({"ffn_down q6_k (Llama-3-8B)", WeightFormat::q6_k, 4096, 14336});
  }
  constexpr int kMatrices = 16;
  std::mt19937 rng(1);
  nlohmann::json results = nlohmann::json::array();
  for (const Shape& s : shapes) {
    if (std::string(s.name).find(only) == std::string::npos) continue;
    if (int8) {
      for (nlohmann::json& r : time_int8_kernels(s, rng, reps)) results.push_back(std::move(r));
      continue;
    }
    std::vector<std::vector<uint8_t>> blocks;
    std::vector<cpu::OwnedPackedWeight> packed;
    for (int m = 0; m < kMatrices; ++m) {
      blocks.push_back(random_blocks(s, rng));
      packed.push_back(cpu::pack_weight(WeightMatrix{blocks.back().data(), s.format, s.rows, s.cols}));
    }
    for (int64_t rows : {1, 2, 4, 8, 16, 24, 32, 48, 64, 128}) {
      std::vector<float> x(size_t(rows * s.cols));
      for (float& v : x) v = std::normal_distribution<float>()(rng);
      std::vector<float> out(size_t(rows * s.rows));
      auto each = [&](auto&& product) {
        return [&, product] {
          for (const cpu::OwnedPackedWeight& p : packed) product(p.view);
        };
      };
      const double fused = median_seconds(reps, each([&](const cpu::PackedWeight& w) {
        cpu::quantized_matmul_fused(x.data(), rows, w, out.data(), cpu::best_cpu_isa());
      })) / kMatrices;
      const double tiles = median_seconds(reps, each([&](const cpu::PackedWeight& w) {
        cpu::quantized_matmul_tiles(x.data(), rows, w, out.data());
      })) / kMatrices;
      const double macs = double(rows) * double(s.rows) * double(s.cols);
      results.push_back({{"matrix", s.name}, {"rows_of_x", rows}, {"fused_us", fused * 1e6},
                         {"tiles_us", tiles * 1e6}, {"fused_gmacs", macs / fused / 1e9},
                         {"tiles_gmacs", macs / tiles / 1e9}, {"faster", fused <= tiles ? "fused" : "tiles"}});
      std::cout << s.name << ", " << rows << " rows: fused " << fused * 1e6 << " us, tiles " << tiles * 1e6
                << " us\n";
    }
  }
  if (out_path.empty()) return 0;
  std::string command = "build/bench/quantized_matmul_paths";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  const nlohmann::json report = {{"command", command},
                                 {"commit", build_commit()},
                                 {"machine", machine_json()},
                                 {"threads", cpu::compute_pool().size()},
                                 {"isa", std::string(cpu::cpu_isa_name(cpu::best_cpu_isa()))},
                                 {"dequantized_tile_min_rows", cpu::kDequantizedTileMinRows},
                                 {"results", results}};
  std::ofstream(out_path) << report.dump(1) << "\n";
  std::cout << "wrote " << out_path << "\n";
}
