#include "kernels/cpu/quantized_matmul.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {
namespace {

// Weight rows per chunk: several chunks per thread, so that a thread the scheduler has paused leaves its share to
// the others, but chunks of at least 16 rows, so that claiming one costs little beside its work.
int64_t rows_per_chunk(int64_t rows) {
  const int64_t chunks = int64_t(compute_pool().size()) * 8;
  return std::max<int64_t>(16, (rows + chunks - 1) / chunks);
}

// Weight rows per fp32 tile: 64 rows of a 4,096-wide matrix are 1 MiB, within a core's L2.
constexpr int64_t kTileRows = 64;

}  // namespace

void quantized_matmul(const float* x, int64_t n_rows, const PackedWeight& w, float* out, CpuIsa isa) {
  if (n_rows >= kDequantizedTileMinRows) {
    quantized_matmul_tiles(x, n_rows, w, out);
  } else {
    quantized_matmul_fused(x, n_rows, w, out, isa);
  }
}

void quantized_matmul_fused(const float* x, int64_t n_rows, const PackedWeight& w, float* out, CpuIsa isa) {
  if (n_rows == 0) return;
  const QuantizedDotFn dot = quantized_dot(isa);
  parallel_for(w.rows, rows_per_chunk(w.rows),
               [&](int64_t begin, int64_t end) { dot(w, begin, end, x, n_rows, out, w.rows); });
}

void quantized_matmul_shared_input(const float* x, int64_t n_rows, std::span<const PackedWeight* const> w,
                                   std::span<float* const> out, CpuIsa isa) {
  if (n_rows == 0) return;
  if (n_rows >= kDequantizedTileMinRows) {
    for (size_t i = 0; i < w.size(); ++i) quantized_matmul_tiles(x, n_rows, *w[i], out[i]);
    return;
  }
  // Each matrix's rows cut as quantized_matmul_fused cuts them, all the chunks in one loop.
  struct Chunk {
    size_t matrix;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t step = rows_per_chunk(w[i]->rows);
    for (int64_t b = 0; b < w[i]->rows; b += step) chunks.push_back({i, b, std::min(w[i]->rows, b + step)});
  }
  const QuantizedDotFn dot = quantized_dot(isa);
  parallel_for(int64_t(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& chunk = chunks[size_t(c)];
      const PackedWeight& m = *w[chunk.matrix];
      dot(m, chunk.begin, chunk.end, x, n_rows, out[chunk.matrix], m.rows);
    }
  });
}

void quantized_matmul_tiles(const float* x, int64_t n_rows, const PackedWeight& w, float* out) {
  if (n_rows == 0) return;
  parallel_for(w.rows, kTileRows, [&](int64_t begin, int64_t end) {
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
