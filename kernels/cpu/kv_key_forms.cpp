// Expected Attention's reads of the cache on the CPU. Work per entry: m forms of head_dim^2 + head_dim
// multiply-adds (the key through each matrix, then a dot product) and one value norm; at the end of a 4,000-token
// prompt on SmolLM2 (3 forms of 64 x 64 per KV head), about 50 M multiply-adds per KV head and layer.
#include "kernels/cpu/kv_key_forms.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {
namespace {

// One block's keys and values of one KV head, as floats: an fp32 block's own rows, a quantized block's dequantized
// (a 16-bit block's widened) into the buffers, as attention reads them.
struct BlockRows {
  const float* keys = nullptr;
  const float* values = nullptr;
};

BlockRows block_rows(const KvPoolView& pool, int32_t id, int head, int n, std::vector<float>& key_buffer,
                     std::vector<float>& value_buffer) {
  const KvBlockLayout& L = pool.layout;
  if (pool.is_coded(id)) throw std::invalid_argument("kv_key_forms: codebook-coded blocks are not read");
  if (!pool.is_quantized(id) && kv_rows_are_f32(pool)) {
    const float* block = pool.block_f32(id);
    return {block + L.k_offset(head, 0), block + L.v_offset(head, 0)};
  }
  key_buffer.resize(size_t(L.block_size) * L.head_dim);
  value_buffer.resize(size_t(L.block_size) * L.head_dim);
  read_head_entries(pool, id, head, n, /*values=*/false, key_buffer.data());
  read_head_entries(pool, id, head, n, /*values=*/true, value_buffer.data());
  return {key_buffer.data(), value_buffer.data()};
}

}  // namespace

void kv_key_forms(std::span<const int32_t> block_table, int head, std::span<const float> linear,
                  std::span<const float> quadratic, const KvPoolView& pool, std::span<float> forms,
                  std::span<float> value_norms) {
  const KvBlockLayout& L = pool.layout;
  const int d = L.head_dim;
  const int64_t n = int64_t(value_norms.size());
  if (head < 0 || head >= L.n_kv_heads) {
    throw std::invalid_argument("kv_key_forms: KV head " + std::to_string(head) + " out of range");
  }
  require_kv_element_type(pool, "kv_key_forms");
  if (linear.size() % size_t(d) != 0) throw std::invalid_argument("kv_key_forms: linear is not [m][head_dim]");
  const int64_t m = int64_t(linear.size()) / d;
  if (int64_t(quadratic.size()) != m * d * d || int64_t(forms.size()) != m * n) {
    throw std::invalid_argument("kv_key_forms: quadratic [m][head_dim][head_dim] and forms [m][entries] expected");
  }
  if (n > int64_t(block_table.size()) * L.block_size) {
    throw std::invalid_argument("kv_key_forms: more entries than the block table holds");
  }
  const int64_t n_blocks = (n + L.block_size - 1) / L.block_size;
  parallel_for(n_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> key_buffer, value_buffer;
    std::vector<float> through(static_cast<size_t>(d));
    for (int64_t b = begin; b < end; ++b) {
      const int rows = int(std::min<int64_t>(L.block_size, n - b * L.block_size));
      const BlockRows block = block_rows(pool, block_table[size_t(b)], head, rows, key_buffer, value_buffer);
      for (int t = 0; t < rows; ++t) {
        const int64_t e = b * L.block_size + t;
        const float* k = block.keys + int64_t(t) * d;
        const float* v = block.values + int64_t(t) * d;
        float v2 = 0.0f;
        for (int i = 0; i < d; ++i) v2 += v[i] * v[i];
        value_norms[size_t(e)] = std::sqrt(v2);
        for (int64_t j = 0; j < m; ++j) {
          // through = Q_j k, then k . (through + linear_j).
          const float* q = quadratic.data() + j * d * d;
          for (int i = 0; i < d; ++i) {
            const float* row = q + int64_t(i) * d;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int c = 0; c < d; ++c) acc += row[c] * k[c];
            through[size_t(i)] = acc + linear[size_t(j * d + i)];
          }
          float form = 0.0f;
          for (int i = 0; i < d; ++i) form += k[i] * through[size_t(i)];
          forms[size_t(j * n + e)] = form;
        }
      }
    }
  });
}

}  // namespace strata::cpu
