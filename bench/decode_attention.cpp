// The CPU backend's paged attention (kernels/cpu/paged_attention.cpp) on decode steps: one query row per sequence
// over its whole cache, at SmolLM2-135M's and Llama-3-8B's head shapes, batches of 1 and 8, contexts of 256 to 4,096
// entries scattered over the pool: in full-precision blocks of 16 (fp32, bfloat16, half: kv_cache.dtype), then in
// KIVI blocks of 32 (int8, int4, int2: every block quantized, random codes), whose rate counts the bytes they hold
// (codes, scales and mins).
//
//   build/bench/decode_attention [--reps 20] [--kv f32,bf16,f16,int8,int4,int2] [--shapes smollm2-135m,llama-3-8b]
//                                [--out FILE]
//
// A step's attention reads each layer's cache once, so each timing runs the op once per layer over as many
// layers as the model has (fewer where they would pass 512 MiB), each with its own blocks, and divides. Between two
// passes (untimed) it reads 64 MiB of other memory, as a step's weights stream through the caches between one
// step's attention and the next: the entries come from memory as in a real step. The result is the median of
// --reps such passes, on the compute pool's threads (every core), with the rate at which it reads the cache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/build_commit.h"
#include "daemon/commands/machine_info.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/kv_quantization.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_block_layout.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int n_heads, n_kv_heads, head_dim, layers;
};

constexpr int kBlockSize = 16;
constexpr int64_t kMaxPoolBytes = int64_t(512) << 20;

// Reads 64 MiB (more than the last-level caches hold) so that what a pass read before is gone from them.
void evict_caches() {
  static const std::vector<uint64_t> other(size_t(8) << 20, 1);
  uint64_t sum = 0;
  for (uint64_t word : other) sum += word;
  volatile uint64_t keep = sum;
  (void)keep;
}

struct Case {
  const Shape& shape;
  int batch, context;
  KvQuant quant;  // none: full-precision blocks of 16; else KIVI blocks of 32, every one quantized
  DType dtype;    // the full-precision blocks' elements
};

// A --kv name: a full-precision element type or a KIVI format.
struct KvFormat {
  std::string name;
  KvQuant quant;
  DType dtype;
};

// Every block of a quantized pool (n_slots 0: each id a quantized block) made of random codes, with scales and
// mins of a plausible size, as sealed blocks hold.
void fill_quantized(const KvPoolView& pool, int32_t n_blocks, std::mt19937& rng) {
  const KvBlockLayout& L = pool.layout;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 0.2f), min(-2.0f, -0.5f);
  for (int32_t b = 0; b < n_blocks; ++b) {
    uint8_t* block = pool.block_quantized(b);
    for (int64_t i = 0; i < 2 * L.codes_bytes(); ++i) block[i] = uint8_t(byte(rng));
    auto* scales = reinterpret_cast<uint16_t*>(block + 2 * L.codes_bytes());
    const int64_t n_scales = (L.quantized_block_bytes() - 2 * L.codes_bytes()) / kKvScaleBytes;
    for (int64_t i = 0; i < n_scales; ++i) scales[i] = cpu::store_scale(i % 2 == 0 ? scale(rng) : min(rng));
  }
}

// Bytes of cache per entry (all KV heads, K and V; a quantized block's codes, scales and mins).
double entry_bytes(const Case& c) {
  if (c.quant == KvQuant::none) return 2.0 * c.shape.n_kv_heads * c.shape.head_dim * dtype_bytes(c.dtype);
  const KvBlockLayout layout{c.shape.n_kv_heads, c.shape.head_dim, kKvQuantGroup, DType::f32, c.quant};
  return double(layout.quantized_block_bytes()) / kKvQuantGroup;
}

// The op's time per layer (seconds, median of reps passes over the layers) for one case.
double time_case(const Case& c, int reps, std::mt19937& rng) {
  const bool quantized = c.quant != KvQuant::none;
  const int block_size = quantized ? kKvQuantGroup : kBlockSize;
  const KvBlockLayout layout{c.shape.n_kv_heads, c.shape.head_dim, block_size, c.dtype, c.quant};
  const int blocks_per_seq = (c.context + block_size - 1) / block_size;
  const int64_t block_bytes = quantized ? layout.quantized_block_bytes() : layout.block_bytes();
  const int64_t layer_bytes = int64_t(c.batch) * blocks_per_seq * block_bytes;
  const int layers = int(std::clamp<int64_t>(kMaxPoolBytes / layer_bytes, 1, c.shape.layers));
  const int32_t n_blocks = layers * c.batch * blocks_per_seq;

  // The pool in memory as the CPU backend maps it (huge pages where granted).
  const int64_t slots = quantized ? n_blocks / layout.quantized_per_slot() + 1 : n_blocks;
  const cpu::HostMapping mapping(size_t(slots * layout.block_bytes()));
  const KvPoolView pool{mapping.data(), layout, quantized ? 0 : n_blocks, {}};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (quantized) {
    fill_quantized(pool, n_blocks, rng);
  } else {
    std::vector<float> block(size_t(layout.elements_per_block()));
    for (int32_t b = 0; b < n_blocks; ++b) {
      for (float& x : block) x = normal(rng);
      cpu::write_kv_rows(pool, b, 0, block.data(), int64_t(block.size()));
    }
  }
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  // Per layer, the batch's sequences: each decodes its entry `context - 1` after context - 1 earlier ones.
  std::vector<std::vector<AttentionSequence>> steps(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    for (int s = 0; s < c.batch; ++s) {
      const size_t first = size_t((l * c.batch + s) * blocks_per_seq);
      const std::span<const int32_t> table(ids.data() + first, size_t(blocks_per_seq));
      steps[size_t(l)].push_back(AttentionSequence{s, 1, c.context - 1, table});
    }
  }
  const int64_t width = int64_t(c.shape.n_heads) * c.shape.head_dim;
  std::vector<float> q(size_t(c.batch * width)), out(q.size());
  for (float& x : q) x = normal(rng);
  const float scale = 1.0f / std::sqrt(float(c.shape.head_dim));

  auto pass = [&] {
    for (const std::vector<AttentionSequence>& step : steps) {
      cpu::paged_attention(q.data(), step, pool, c.shape.n_heads, scale, out.data());
    }
  };
  pass();  // warm-up
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    evict_caches();
    const Clock::time_point start = Clock::now();
    pass();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count() / layers);
  }
  std::nth_element(seconds.begin(), seconds.begin() + reps / 2, seconds.end());
  return seconds[size_t(reps / 2)];
}

// The comma-separated items of a flag's value.
std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  for (size_t begin = 0; begin <= list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    items.push_back(list.substr(begin, end - begin));
    begin = end + 1;
  }
  return items;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::string out_path;
  const std::vector<KvFormat> all_formats = {
      {"f32", KvQuant::none, DType::f32},  {"bf16", KvQuant::none, DType::bf16}, {"f16", KvQuant::none, DType::f16},
      {"int8", KvQuant::int8, DType::f32}, {"int4", KvQuant::int4, DType::f32},  {"int2", KvQuant::int2, DType::f32}};
  const std::vector<Shape> all_shapes = {{"smollm2-135m", 9, 3, 64, 30}, {"llama-3-8b", 32, 8, 128, 32}};
  std::vector<KvFormat> formats = all_formats;
  std::vector<Shape> shapes = all_shapes;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--reps") {
      reps = std::stoi(argv[i + 1]);
    } else if (flag == "--out") {
      out_path = argv[i + 1];
    } else if (flag == "--kv" || flag == "--shapes") {
      const std::vector<std::string> names = split_list(argv[i + 1]);
      const auto chosen = [&](const std::string& name) {
        return std::find(names.begin(), names.end(), name) != names.end();
      };
      if (flag == "--kv") {
        formats.clear();
        std::copy_if(all_formats.begin(), all_formats.end(), std::back_inserter(formats),
                     [&](const KvFormat& f) { return chosen(f.name); });
      } else {
        shapes.clear();
        std::copy_if(all_shapes.begin(), all_shapes.end(), std::back_inserter(shapes),
                     [&](const Shape& s) { return chosen(s.name); });
      }
      if (formats.empty() || shapes.empty()) {
        std::cerr << "decode_attention: " << flag << " names none of its choices\n";
        return 2;
      }
    } else {
      std::cerr << "decode_attention: unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (reps < 1) {
    std::cerr << "decode_attention: --reps must be positive\n";
    return 2;
  }
  std::mt19937 rng(1);
  nlohmann::json results = nlohmann::json::array();
  for (const KvFormat& format : formats) {
    for (const Shape& shape : shapes) {
      for (int batch : {1, 8}) {
        for (int context : {256, 1024, 4096}) {
          const Case c{shape, batch, context, format.quant, format.dtype};
          const double seconds = time_case(c, reps, rng);
          const double kv_bytes = double(batch) * context * entry_bytes(c);
          const std::string& kv = format.name;
          results.push_back({{"shape", shape.name}, {"kv", kv}, {"batch", batch}, {"context", context},
                             {"us", seconds * 1e6}, {"kv_gb_per_s", kv_bytes / seconds / 1e9}});
          std::cout << shape.name << ", " << kv << ", batch " << batch << ", context " << context << ": "
                    << seconds * 1e6 << " us, " << kv_bytes / seconds / 1e9 << " GB/s of cache\n";
        }
      }
    }
  }
  if (out_path.empty()) return 0;
  std::string command = "build/bench/decode_attention";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  const nlohmann::json report = {{"what", "CPU paged attention on decode steps, per layer (decode_attention.cpp)"},
                                 {"command", command},
                                 {"commit", build_commit()},
                                 {"machine", machine_json()},
                                 {"threads", cpu::compute_pool().size()},
                                 {"block_size", {{"full_precision", kBlockSize}, {"quantized", kKvQuantGroup}}},
                                 {"results", results}};
  std::ofstream(out_path) << report.dump(1) << "\n";
  std::cout << "wrote " << out_path << "\n";
}
