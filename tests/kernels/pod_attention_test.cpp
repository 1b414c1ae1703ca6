// PoD attention (kernels/pod_attention.h) against an independent reference: one softmax over the concatenated
// proximal and distant logits (spec §4), computed here in double from the block layout; the gate on given logits;
// and the plain attention a leader must reproduce.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/pod_attention.h"

namespace strata {
namespace {

constexpr int kHeads = 4, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

// Two layers' caches of n entries in one small pool: layer 0 (the leader) in blocks [0, nb), layer 1 in [nb, 2nb).
struct Fixture {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  KvBlockLayout layout{kKvHeads, kHeadDim, kBlock, DType::f32};
  std::vector<float> storage;
  KvPoolView pool;
  std::vector<int32_t> leader_table, own_table;
  Fixture(int n, std::mt19937& rng) {
    const int nb = (n + kBlock - 1) / kBlock;
    storage.resize(size_t(2 * nb * layout.elements_per_block()));
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (float& x : storage) x = g(rng);
    pool = KvPoolView{storage.data(), layout, int32_t(2 * nb), {}};
    for (int b = 0; b < nb; ++b) {
      leader_table.push_back(b);
      own_table.push_back(nb + b);
    }
  }
  const float* key(const std::vector<int32_t>& t, int h, int e) const {
    return pool.block_f32(t[size_t(e / kBlock)]) + layout.k_offset(h, e % kBlock);
  }
  const float* value(const std::vector<int32_t>& t, int h, int e) const {
    return pool.block_f32(t[size_t(e / kBlock)]) + layout.v_offset(h, e % kBlock);
  }
};

std::vector<float> random_rows(int rows, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(size_t(rows * kHeads * kHeadDim));
  for (float& x : v) x = g(rng);
  return v;
}

double dot(const float* a, const float* b) {
  double s = 0;
  for (int d = 0; d < kHeadDim; ++d) s += double(a[d]) * b[d];
  return s;
}

TEST(PodGate, OnGivenLogits) {
  // aP = {1, 2}, aD = {0.5}: g = (e + e^2) / (e + e^2 + e^0.5).
  const float lse_p = std::log(std::exp(1.0f) + std::exp(2.0f)), lse_d = 0.5f;
  const double e = std::exp(1.0);
  EXPECT_NEAR(pod_gate(lse_p, lse_d), (e + e * e) / (e + e * e + std::sqrt(e)), 1e-6);
  EXPECT_EQ(pod_gate(3.0f, -INFINITY), 1.0f);  // no distant entries: proximal attention alone
  EXPECT_NEAR(pod_gate(2.0f, 2.0f), 0.5f, 1e-7);
}

// A follower's output = softmax([q·K_own[P]; q_lead·K_lead[D]] * scale) · V_own over P ∪ D, per row and head.
std::vector<float> reference(const Fixture& f, const std::vector<float>& q, const std::vector<float>& q_lead,
                             int n_before, int n_q, PodWindow w, float scale) {
  std::vector<float> out(q.size());
  for (int i = 0; i < n_q; ++i) {
    const int pos = n_before + i;
    for (int h = 0; h < kHeads; ++h) {
      const int kv = h / (kHeads / kKvHeads);
      const float* qv = q.data() + (i * kHeads + h) * kHeadDim;
      const float* qd = q_lead.data() + (i * kHeads + h) * kHeadDim;
      std::vector<double> logit(size_t(pos + 1));
      for (int j = 0; j <= pos; ++j) {
        const bool proximal = j < w.sinks || j > pos - w.recent;
        logit[size_t(j)] = scale * (proximal ? dot(qv, f.key(f.own_table, kv, j)) : dot(qd, f.key(f.leader_table, kv, j)));
      }
      double mx = -1e300, sum = 0;
      for (double a : logit) mx = std::max(mx, a);
      for (double& a : logit) sum += (a = std::exp(a - mx));
      for (int d = 0; d < kHeadDim; ++d) {
        double o = 0;
        for (int j = 0; j <= pos; ++j) o += logit[size_t(j)] / sum * f.value(f.own_table, kv, j)[d];
        out[size_t((i * kHeads + h) * kHeadDim + d)] = float(o);
      }
    }
  }
  return out;
}

TEST(PodAttention, FollowerEqualsOneSoftmaxOverProximalAndLeaderDistantLogits) {
  std::mt19937 rng(11);
  const int n = 23, n_q = 5, n_before = n - n_q;  // a prefill chunk: rows at positions 18..22
  Fixture f(n, rng);
  const std::vector<float> q = random_rows(n_q, rng), q_lead = random_rows(n_q, rng);
  const PodWindow w{3, 6};
  std::vector<float> out(q.size());
  Tensor qt{const_cast<float*>(q.data()), DType::f32, n_q, kHeads * kHeadDim}, ot{out.data(), DType::f32, n_q, kHeads * kHeadDim};
  AttentionSequence s{0, n_q, n_before, f.own_table};
  PodDistant d{{f.leader_table, f.leader_table}, {q_lead.data(), q_lead.data()}};
  f.backend->pod_attention(qt, {&s, 1}, {&d, 1}, f.pool, kHeads, 0.35f, w, ot);
  const std::vector<float> expected = reference(f, q, q_lead, n_before, n_q, w, 0.35f);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-5) << i;
}

TEST(PodAttention, AtTheLeaderEqualsFullAttention) {
  // Shared scores that are the layer's own (its own queries and keys for the distant part) give full attention.
  std::mt19937 rng(5);
  const int n = 30, n_q = 4, n_before = n - n_q;
  Fixture f(n, rng);
  const std::vector<float> q = random_rows(n_q, rng);
  std::vector<float> pod(q.size()), full(q.size());
  Tensor qt{const_cast<float*>(q.data()), DType::f32, n_q, kHeads * kHeadDim};
  Tensor pt{pod.data(), DType::f32, n_q, kHeads * kHeadDim}, ft{full.data(), DType::f32, n_q, kHeads * kHeadDim};
  AttentionSequence s{0, n_q, n_before, f.own_table};
  PodDistant d{{f.own_table, f.own_table}, {q.data(), q.data()}};
  f.backend->pod_attention(qt, {&s, 1}, {&d, 1}, f.pool, kHeads, 0.3f, PodWindow{2, 5}, pt);
  f.backend->paged_attention(qt, {&s, 1}, f.pool, kHeads, 0.3f, ft);
  for (size_t i = 0; i < pod.size(); ++i) EXPECT_NEAR(pod[i], full[i], 1e-5) << i;
}

TEST(PodAttention, PairedBlocksGiveTheSameOutput) {
  // Blocks 1 and 2 of the follower (entries 4..11) are distant for every row; pairing moves block 2's values into
  // block 1's key region, and the table names block 1 twice. The output must not change.
  std::mt19937 rng(8);
  const int n = 20, n_q = 2, n_before = n - n_q;
  Fixture f(n, rng);
  const std::vector<float> q = random_rows(n_q, rng), q_lead = random_rows(n_q, rng);
  const PodWindow w{2, 4};
  std::vector<float> before(q.size()), after(q.size());
  Tensor qt{const_cast<float*>(q.data()), DType::f32, n_q, kHeads * kHeadDim};
  Tensor bt{before.data(), DType::f32, n_q, kHeads * kHeadDim}, at{after.data(), DType::f32, n_q, kHeads * kHeadDim};
  AttentionSequence s{0, n_q, n_before, f.own_table};
  PodDistant d{{f.leader_table, f.leader_table}, {q_lead.data(), q_lead.data()}};
  f.backend->pod_attention(qt, {&s, 1}, {&d, 1}, f.pool, kHeads, 0.3f, w, bt);
  const int32_t first = f.own_table[1], second = f.own_table[2];
  f.backend->kv_pair_values(std::vector<int32_t>{first}, std::vector<int32_t>{second}, f.pool);
  std::vector<int32_t> paired = f.own_table;
  paired[2] = pod_paired_id(first);
  std::fill(f.storage.begin() + second * f.layout.elements_per_block(),
            f.storage.begin() + (second + 1) * f.layout.elements_per_block(), NAN);  // the freed block is gone
  AttentionSequence sp{0, n_q, n_before, paired};
  f.backend->pod_attention(qt, {&sp, 1}, {&d, 1}, f.pool, kHeads, 0.3f, w, at);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i]) << i;
}

}  // namespace
}  // namespace strata
