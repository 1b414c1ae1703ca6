// SpindleKV's codebook ops on the CPU backend (kernels/cpu/kv_codebook.cpp) against hand-computed cases: the
// greedy order and thresholds of Algorithm 1, keys un-rotated before the build, the decode-time match, and
// attention over coded blocks against attention over the hand-reconstructed vectors.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace strata {
namespace {

constexpr double kDeg = std::numbers::pi / 180.0;

// One KV head, head dim 4 (the vectors below use the first RoPE pair only), 8 entries per block, 4 slots of 256
// bytes: the layer's entries 0-7 live in block 2; slot 0 holds codebook vectors (16 a slot), slot 3 one coded
// block (8 * 20 bytes), id n_slots + 3 = 7.
struct SmallPool {
  KvBlockLayout layout{1, 4, 8, DType::f32};
  std::vector<float> memory = std::vector<float>(size_t(4 * layout.elements_per_block()), 0.0f);
  std::vector<float> rope_table = std::vector<float>(64 * 4);
  std::vector<int32_t> table = {2};
  RopeParams rope{RopeStyle::interleaved, 10000.0f, {}};

  SmallPool() { key_rope_table(4, rope, 64, rope_table.data()); }
  KvPoolView view() { return KvPoolView{memory.data(), layout, 4, KvKeyRope{rope_table.data(), 64, rope.style}}; }
  float* key(int entry) { return view().block_f32(2) + layout.k_offset(0, entry); }
  float* value(int entry) { return view().block_f32(2) + layout.v_offset(0, entry); }
};

std::vector<float> polar(double magnitude, double degrees) {
  return {float(magnitude * std::cos(degrees * kDeg)), float(magnitude * std::sin(degrees * kDeg)), 0.0f, 0.0f};
}

std::vector<float> rotated(Backend& backend, const SmallPool& pool, std::vector<float> x, int32_t position) {
  Tensor t{x.data(), DType::f32, 1, 4};
  backend.rope(t, std::span<const int32_t>(&position, 1), 1, 4, pool.rope);
  return x;
}

// Directions 0, 10, 20, 30, 90, 95 degrees with different lengths; theta 0.95 (about 18.2 degrees) joins pairs
// 10 degrees apart, never 20. Degrees of the graph: 2 3 3 2 2 2. Algorithm 1: entry 1 (10 deg, degree 3, the lower
// index of the tie with entry 2) takes {0, 1, 2}; entry 3 drops to degree 1, so entry 4 (90 deg) takes {4, 5};
// entry 3 is last, alone.
const double kAngles[] = {0, 10, 20, 30, 90, 95};
const double kLengths[] = {2, 1, 3, 0.5, 4, 1.5};
const std::vector<int32_t> kPositions = {7, 3, 19, 40, 1, 25};

// Keys stored after RoPE at kPositions (by the backend's own rope op); values the same shape turned by 45 degrees.
void fill(Backend& backend, SmallPool& pool) {
  for (int i = 0; i < 6; ++i) {
    const auto k = rotated(backend, pool, polar(kLengths[i], kAngles[i]), kPositions[size_t(i)]);
    std::copy(k.begin(), k.end(), pool.key(i));
    const auto v = polar(kLengths[i], kAngles[i] + 45);
    std::copy(v.begin(), v.end(), pool.value(i));
  }
}

TEST(KvCodebookBuild, GreedyOrderAndThresholdOnValues) {
  SmallPool pool;
  auto backend = make_cpu_backend();
  fill(*backend, pool);
  std::vector<int32_t> assignment(6), centres(6);
  const int n = backend->kv_codebook_build(pool.table, 0, KvPart::value, kPositions, 0.95f, pool.view(), assignment,
                                           centres);
  ASSERT_EQ(n, 3);
  EXPECT_EQ(assignment, (std::vector<int32_t>{0, 0, 0, 2, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(centres.begin(), centres.begin() + 3), (std::vector<int32_t>{1, 4, 3}));

  // A looser threshold (cos 20 deg = 0.9397 > 0.93) links 0-20 and 10-30 too: degrees 3 4 4 3 2 2, so entry 1
  // takes {0, 1, 2, 3} and entry 4 the rest.
  const int loose = backend->kv_codebook_build(pool.table, 0, KvPart::value, kPositions, 0.93f, pool.view(),
                                               assignment, centres);
  ASSERT_EQ(loose, 2);
  EXPECT_EQ(assignment, (std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(centres.begin(), centres.begin() + 2), (std::vector<int32_t>{1, 4}));
}

// The stored keys point in scattered directions (rotated by different positions); un-rotated, they are the
// directions above, so the build finds the same codebook.
TEST(KvCodebookBuild, KeysAreUnrotatedBeforeTheBuild) {
  SmallPool pool;
  auto backend = make_cpu_backend();
  fill(*backend, pool);
  std::vector<int32_t> assignment(6), centres(6);
  const int n =
      backend->kv_codebook_build(pool.table, 0, KvPart::key, kPositions, 0.95f, pool.view(), assignment, centres);
  ASSERT_EQ(n, 3);
  EXPECT_EQ(assignment, (std::vector<int32_t>{0, 0, 0, 2, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(centres.begin(), centres.begin() + 3), (std::vector<int32_t>{1, 4, 3}));
}

// The coded form of the six entries: key vectors 0-2 and value vectors 3-5 in slot 0, rows in coded block 7.
KvCodebookEncoding encoding() {
  KvCodebookEncoding e;
  e.positions = kPositions;
  e.k_vectors = {0, 0, 0, 2, 1, 1};
  e.v_vectors = {3, 3, 3, 5, 4, 4};
  e.new_k_entries = {1, 4, 3};
  e.new_k_vectors = {0, 1, 2};
  e.new_v_entries = {1, 4, 3};
  e.new_v_vectors = {3, 4, 5};
  e.coded_blocks = {7};
  return e;
}

TEST(KvCodebookEncode, RowsAndUnitVectors) {
  SmallPool pool;
  auto backend = make_cpu_backend();
  fill(*backend, pool);
  backend->kv_codebook_encode(pool.table, encoding(), pool.view());
  const KvPoolView view = pool.view();
  ASSERT_TRUE(view.is_coded(7));
  const KvCodeRow* rows = view.block_coded(7);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(rows[i].k_vector, encoding().k_vectors[size_t(i)]);
    EXPECT_EQ(rows[i].v_vector, encoding().v_vectors[size_t(i)]);
    EXPECT_EQ(rows[i].position, kPositions[size_t(i)]);
    EXPECT_NEAR(rows[i].k_magnitude, kLengths[i], 1e-5);
    EXPECT_NEAR(rows[i].v_magnitude, kLengths[i], 1e-5);
  }
  // Key vector 0 is entry 1's pre-RoPE direction (10 deg), value vector 4 entry 4's (90 + 45 deg).
  const std::vector<float> k0 = polar(1, 10), v4 = polar(1, 135);
  for (int d = 0; d < 4; ++d) {
    EXPECT_NEAR(view.codebook_vector(0)[d], k0[size_t(d)], 1e-6);
    EXPECT_NEAR(view.codebook_vector(4)[d], v4[size_t(d)], 1e-6);
  }
}

// Written back, entry 0 (length 2 at 0 deg, coded by the 10 deg entry) becomes RoPE(2 * (cos 10, sin 10), 7); its
// reconstruction error is 2 * 2 sin(5 deg) = 0.34862 for the key (rotation keeps distances) and for the value.
TEST(KvCodebookEncode, WriteBackAndReconstructionError) {
  SmallPool pool;
  auto backend = make_cpu_backend();
  fill(*backend, pool);
  const std::vector<float> k_before(pool.key(0), pool.key(0) + 4), v_before(pool.value(0), pool.value(0) + 4);
  KvCodebookEncoding e = encoding();
  e.write_back_from = 0;
  backend->kv_codebook_encode(pool.table, e, pool.view());
  const auto k_expected = rotated(*backend, pool, polar(2, 10), 7);
  const auto v_expected = polar(2, 55);
  double k_err = 0, v_err = 0;
  for (int d = 0; d < 4; ++d) {
    EXPECT_NEAR(pool.key(0)[d], k_expected[size_t(d)], 1e-5);
    EXPECT_NEAR(pool.value(0)[d], v_expected[size_t(d)], 1e-5);
    k_err += std::pow(pool.key(0)[d] - k_before[size_t(d)], 2);
    v_err += std::pow(pool.value(0)[d] - v_before[size_t(d)], 2);
  }
  EXPECT_NEAR(std::sqrt(k_err), 4 * std::sin(5 * kDeg), 1e-5);
  EXPECT_NEAR(std::sqrt(v_err), 4 * std::sin(5 * kDeg), 1e-5);
  // Entry 1 is its own centre: no error.
  const auto k1 = rotated(*backend, pool, polar(1, 10), 3);
  for (int d = 0; d < 4; ++d) EXPECT_NEAR(pool.key(1)[d], k1[size_t(d)], 1e-6);
}

// A new key at 3 deg (pre-RoPE), stored at position 50: cosines with the key codebook are cos 7, cos 87, cos 27.
TEST(KvCodebookMatch, BestCosineAndIndex) {
  SmallPool pool;
  auto backend = make_cpu_backend();
  fill(*backend, pool);
  backend->kv_codebook_encode(pool.table, encoding(), pool.view());
  const auto k = rotated(*backend, pool, polar(5, 3), 50);
  std::copy(k.begin(), k.end(), pool.key(6));
  const std::vector<int32_t> entry = {6}, position = {50}, codebook = {0, 1, 2};
  float similarity = 0;
  int32_t index = -1;
  backend->kv_codebook_match(pool.table, 0, KvPart::key, entry, position, codebook, pool.view(),
                             std::span<float>(&similarity, 1), std::span<int32_t>(&index, 1));
  EXPECT_NEAR(similarity, std::cos(7 * kDeg), 1e-6);
  EXPECT_EQ(index, 0);
  backend->kv_codebook_match(pool.table, 0, KvPart::key, entry, position, std::vector<int32_t>{1, 2}, pool.view(),
                             std::span<float>(&similarity, 1), std::span<int32_t>(&index, 1));
  EXPECT_NEAR(similarity, std::cos(27 * kDeg), 1e-6);
  EXPECT_EQ(index, 1);
}

// Attention over the coded block equals attention over a full-precision block that holds the reconstructions
// RoPE(m C[r], p) and m C[r], computed here with the rope op.
TEST(KvCodebookAttention, CodedBlockReadsTheReconstructions) {
  SmallPool pool;
  auto backend = make_cpu_backend();
  fill(*backend, pool);
  backend->kv_codebook_encode(pool.table, encoding(), pool.view());
  const KvPoolView view = pool.view();
  const KvCodeRow* rows = view.block_coded(7);
  float* plain = view.block_f32(1);
  for (int i = 0; i < 6; ++i) {
    std::vector<float> k(4), v(4);
    for (int d = 0; d < 4; ++d) {
      k[size_t(d)] = rows[i].k_magnitude * view.codebook_vector(rows[i].k_vector)[d];
      v[size_t(d)] = rows[i].v_magnitude * view.codebook_vector(rows[i].v_vector)[d];
    }
    k = rotated(*backend, pool, k, rows[i].position);
    std::copy(k.begin(), k.end(), plain + pool.layout.k_offset(0, i));
    std::copy(v.begin(), v.end(), plain + pool.layout.v_offset(0, i));
  }
  std::vector<float> q = {0.3f, -1.2f, 0.7f, 0.2f}, coded_out(4), plain_out(4);
  Tensor qt{q.data(), DType::f32, 1, 4};
  const std::vector<int32_t> coded_table = {7}, plain_table = {1};
  std::vector<float> coded_sums(6, 0.0f), plain_sums(6, 0.0f);
  AttentionSequence coded{0, 1, 5, coded_table, coded_sums.data(), 6, 0};
  AttentionSequence reference{0, 1, 5, plain_table, plain_sums.data(), 6, 0};
  Tensor out{coded_out.data(), DType::f32, 1, 4};
  backend->paged_attention(qt, std::span<const AttentionSequence>(&coded, 1), view, 1, 0.5f, out);
  out = Tensor{plain_out.data(), DType::f32, 1, 4};
  backend->paged_attention(qt, std::span<const AttentionSequence>(&reference, 1), view, 1, 0.5f, out);
  for (int d = 0; d < 4; ++d) EXPECT_NEAR(coded_out[size_t(d)], plain_out[size_t(d)], 1e-5);
  for (int e = 0; e < 6; ++e) EXPECT_NEAR(coded_sums[size_t(e)], plain_sums[size_t(e)], 1e-6);
}

}  // namespace
}  // namespace strata
