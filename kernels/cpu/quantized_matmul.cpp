#include "kernels/cpu/quantized_matmul.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {
namespace {

// Weight rows per chunk: several chunks per thread, so that a thread the scheduler has paused leaves its share to
// the others, but chunks of at least 16 rows, so that claiming one costs little beside its work; whole tiles of
// a 16-row tile layout. Four a thread: SmolLM2's batch-1 decode ran 1.02-1.11x as fast as with eight, where a
// chunk of its smallest matrices is three tiles (docs/decisions.md, [cpu-xeon]).
int64_t rows_per_chunk(const PackedWeight& w) {
  const int64_t chunks = int64_t(compute_pool().size()) * 4;
  const int64_t rows = std::max<int64_t>(16, (w.rows + chunks - 1) / chunks);
  return is_rows16(w.layout) ? (rows + kTileRows16 - 1) / kTileRows16 * kTileRows16 : rows;
}

// Weight rows per fp32 tile: as many as 1 MiB of fp32 holds and at least 64 (64 rows of a 4,096-wide matrix are 1
// MiB, within a core's L2 beside x), cut evenly into a multiple of the pool's threads. BLAS packs x again for every
// tile, so a narrow matrix's tiles are taken as large as that allows: SmolLM2's 576-wide matrices in 288 or 384
// rows, where 64 a tile ran the prefill of its f16 file and of its Q4_1 one with f32 activations at 0.8-0.9x.
int64_t tile_rows(const PackedWeight& w) {
  const int64_t threads = compute_pool().size();
  const int64_t most = std::max<int64_t>(64, (int64_t{1} << 20) / (w.cols * int64_t(sizeof(float))));
  const int64_t tiles = threads * ((w.rows + threads * most - 1) / (threads * most));
  return ((w.rows + tiles - 1) / tiles + 15) / 16 * 16;
}

bool pair_layout(const PackedWeight& w) {
  return w.layout == PackedLayout::u4_pairs || w.layout == PackedLayout::u8_pairs;
}

// x rounded to integers, and the values that stands for, in the calling thread's buffers (kept between calls).
struct RoundedActivations {
  IntegerActivations rounded;
  std::vector<float> values;
};
const RoundedActivations& round_to_integers(const float* x, int64_t n_rows, int64_t cols,
                                            ActivationDtype activations) {
  thread_local RoundedActivations buffers;
  buffers.values.resize(size_t(n_rows * cols));
  round_activations(x, n_rows, cols, activations == ActivationDtype::int16 ? 2 : 1, buffers.rounded,
                    buffers.values.data());
  return buffers;
}

// The rows [begin, end) of w against x as the fused kernels take them: the integer one for a 16-row tile or pair
// layout when x is rounded (`rounded` not null), else the fp32 one on x (the rounded values when rounded: the
// k-quants' blocks used in place have no integer kernel).
void fused_rows(const PackedWeight& w, int64_t begin, int64_t end, const float* x, int64_t n_rows,
                const IntegerActivations* rounded, float* out, CpuIsa isa) {
  if (rounded != nullptr && (is_rows16(w.layout) || pair_layout(w))) {
    quantized_dot_int8(isa)(w, begin, end, *rounded, out, w.rows);
  } else {
    quantized_dot(isa)(w, begin, end, x, n_rows, out, w.rows);
  }
}

// Whether w's product with n_rows rows of x runs on dequantized fp32 tiles: from kDequantizedTileMinRows rows, but
// for the 16-row tiles with integer activations, whose integer kernel does 4 products where an fp32 multiply-add does
// one (at 128 rows of x 3.0-5.9x BLAS's speed on the dequantized tiles: bench/quantized_matmul_paths --int8,
// bench/results/cpu-int8-kernels-kquants-epyc-avx512vnni.json).
bool on_dequantized_tiles(const PackedWeight& w, int64_t n_rows, bool rounded) {
  return n_rows >= kDequantizedTileMinRows && !(rounded && is_rows16(w.layout));
}

}  // namespace

void quantized_matmul(const float* x, int64_t n_rows, const PackedWeight& w, float* out,
                      ActivationDtype activations, CpuIsa isa) {
  if (activations != ActivationDtype::f32 && n_rows > 0 && !is_half(w.layout)) {
    const RoundedActivations& r = round_to_integers(x, n_rows, w.cols, activations);
    if (on_dequantized_tiles(w, n_rows, true)) {
      quantized_matmul_tiles(r.values.data(), n_rows, w, out);
    } else {
      quantized_matmul_integer(r.rounded, r.values.data(), w, out, isa);
    }
    return;
  }
  if (n_rows >= kDequantizedTileMinRows) {
    quantized_matmul_tiles(x, n_rows, w, out);
  } else {
    quantized_matmul_fused(x, n_rows, w, out, isa);
  }
}

void quantized_matmul_fused(const float* x, int64_t n_rows, const PackedWeight& w, float* out, CpuIsa isa) {
  if (n_rows == 0) return;
  if (is_rows16(w.layout)) throw std::logic_error("quantized_matmul_fused: 16-row tiles take integer activations only");
  const QuantizedDotFn dot = quantized_dot(isa);
  parallel_for(w.rows, rows_per_chunk(w),
               [&](int64_t begin, int64_t end) { dot(w, begin, end, x, n_rows, out, w.rows); });
}

void quantized_matmul_integer(const IntegerActivations& x, const float* x_hat, const PackedWeight& w, float* out,
                              CpuIsa isa) {
  if (x.rows == 0) return;
  parallel_for(w.rows, rows_per_chunk(w), [&](int64_t begin, int64_t end) {
    fused_rows(w, begin, end, x_hat, x.rows, &x, out, isa);
  });
}

void quantized_matmul_shared_input(const float* x, int64_t n_rows, std::span<const PackedWeight* const> w,
                                   std::span<float* const> out, ActivationDtype activations, CpuIsa isa) {
  if (n_rows == 0) return;
  // What each matrix multiplies: x rounded to integers (the values and the digits) where asked, but x itself for
  // the 16-bit float layouts (is_half), which need no rounding at all when they are all there is.
  const IntegerActivations* rounded = nullptr;
  const float* x_hat = x;
  const bool any_rounded = std::any_of(w.begin(), w.end(), [](const PackedWeight* m) { return !is_half(m->layout); });
  if (activations != ActivationDtype::f32 && any_rounded) {
    const RoundedActivations& r = round_to_integers(x, n_rows, w[0]->cols, activations);
    rounded = &r.rounded;
    x_hat = r.values.data();
  }
  auto input = [&](const PackedWeight& m) { return is_half(m.layout) ? x : x_hat; };
  auto digits = [&](const PackedWeight& m) { return is_half(m.layout) ? nullptr : rounded; };
  // Each matrix's rows cut as quantized_matmul_fused cuts them, all the chunks in one loop; the matrices that run
  // on dequantized tiles each on their own first.
  struct Chunk {
    size_t matrix;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < w.size(); ++i) {
    if (on_dequantized_tiles(*w[i], n_rows, digits(*w[i]) != nullptr)) {
      quantized_matmul_tiles(input(*w[i]), n_rows, *w[i], out[i]);
      continue;
    }
    const int64_t step = rows_per_chunk(*w[i]);
    for (int64_t b = 0; b < w[i]->rows; b += step) chunks.push_back({i, b, std::min(w[i]->rows, b + step)});
  }
  parallel_for(int64_t(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& chunk = chunks[size_t(c)];
      const PackedWeight& m = *w[chunk.matrix];
      fused_rows(m, chunk.begin, chunk.end, input(m), n_rows, digits(m), out[chunk.matrix], isa);
    }
  });
}

void quantized_matmul_tiles(const float* x, int64_t n_rows, const PackedWeight& w, float* out) {
  if (n_rows == 0) return;
  parallel_for(w.rows, tile_rows(w), [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> tile;
    tile.resize(size_t((end - begin) * w.cols));
    dequantize_rows(w, begin, end - begin, tile.data());
    sgemm_nt(x, tile.data(), n_rows, end - begin, w.cols, out + begin, w.rows);
  });
}

void quantized_embedding(const int32_t* ids, int64_t n_ids, const PackedWeight& table, float* out) {
  for (int64_t t = 0; t < n_ids; ++t) dequantize_rows(table, ids[t], 1, out + t * table.cols);
}

}  // namespace strata::cpu
