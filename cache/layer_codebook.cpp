#include "cache/layer_codebook.h"

#include <stdexcept>

namespace strata {

int64_t LayerCodebook::size() const {
  int64_t n = 0;
  for (const auto& c : keys) n += int64_t(c.size());
  for (const auto& c : values) n += int64_t(c.size());
  return n;
}

void check_codebook_positions(std::span<const std::vector<int32_t>> positions, int n_kv_heads, int n_entries) {
  if (positions.empty() || (positions.size() != 1 && int(positions.size()) != n_kv_heads)) {
    throw std::invalid_argument("kv cache: codebook positions: one list, or one per KV head");
  }
  for (const auto& p : positions) {
    if (int(p.size()) != n_entries) {
      throw std::invalid_argument("kv cache: codebook positions: one per entry of the layer");
    }
  }
}

const std::vector<int32_t>& head_positions(std::span<const std::vector<int32_t>> positions, int h) {
  return positions[positions.size() == 1 ? 0 : size_t(h)];
}

std::vector<HeadCodebookPlan> plan_codebooks(Backend& backend, const KvPoolView& pool,
                                             std::span<const int32_t> block_table,
                                             std::span<const std::vector<int32_t>> positions, int n_entries,
                                             float key_threshold, float value_threshold) {
  std::vector<HeadCodebookPlan> plans(size_t(pool.layout.n_kv_heads));
  for (int h = 0; h < int(plans.size()); ++h) {
    HeadCodebookPlan& p = plans[size_t(h)];
    for (std::vector<int32_t>* v : {&p.k_assign, &p.k_centres, &p.v_assign, &p.v_centres}) v->resize(size_t(n_entries));
    p.k_centres.resize(size_t(backend.kv_codebook_build(block_table, h, KvPart::key, head_positions(positions, h),
                                                        key_threshold, pool, p.k_assign, p.k_centres)));
    p.v_centres.resize(size_t(backend.kv_codebook_build(block_table, h, KvPart::value, head_positions(positions, h),
                                                        value_threshold, pool, p.v_assign, p.v_centres)));
  }
  return plans;
}

int64_t codebook_vectors(std::span<const HeadCodebookPlan> plans) {
  int64_t n = 0;
  for (const HeadCodebookPlan& p : plans) n += int64_t(p.k_centres.size() + p.v_centres.size());
  return n;
}

KvCodebookEncoding head_encoding(const HeadCodebookPlan& plan, int h, const std::vector<int32_t>& positions,
                                 LayerCodebook& cb, const std::function<int32_t()>& next_vector) {
  KvCodebookEncoding e;
  e.head = h;
  e.positions = positions;
  std::vector<int32_t>& keys = cb.keys[size_t(h)];
  std::vector<int32_t>& values = cb.values[size_t(h)];
  for (int32_t centre : plan.k_centres) {
    keys.push_back(next_vector());
    e.new_k_entries.push_back(centre);
    e.new_k_vectors.push_back(keys.back());
  }
  for (int32_t centre : plan.v_centres) {
    values.push_back(next_vector());
    e.new_v_entries.push_back(centre);
    e.new_v_vectors.push_back(values.back());
  }
  for (size_t i = 0; i < plan.k_assign.size(); ++i) {
    e.k_vectors.push_back(keys[size_t(plan.k_assign[i])]);
    e.v_vectors.push_back(values[size_t(plan.v_assign[i])]);
  }
  return e;
}

}  // namespace strata
