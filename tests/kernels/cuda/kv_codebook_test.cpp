// SpindleKV's codebook ops on CUDA (kernels/cuda/kv_codebook.cu) against their CPU twins on random pools
// (tests/kernels/cuda/twin_pool.h), bit for bit (the reasons are below).
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"
#include "kernels/kv_codebook.h"
#include "tests/kernels/cuda/twin_pool.h"

namespace strata {
namespace {

using test::DevicePoolCopy;
using test::PoolReader;
using test::round_bf16;
using test::TwinPool;
using CudaKvCodebook = test::CudaTest;

// The device repeats the CPU's arithmetic operation by operation without fused multiply-adds (neither build has
// any): norms are the float of the square root of a double sum of squares in channel order, cosines float sums of
// products in channel order, with correctly rounded division and square root on both sides. On the same numbers
// the results are therefore the CPU's bit for bit, and these tests compare exactly: the build's codebook; the
// match's indices and cosines; the encode's code rows (magnitudes included) and codebook vectors; written-back
// entries as the CPU's f32 reconstruction rounded to bf16 (to nearest even, as the device stores it). A tolerance
// would hide the one-ulp differences that move an entry across the threshold of a build.
//
// The pools: 2 KV heads of 64 channels, blocks of 16 entries, 160 slots (an f32 slot is 16 KiB, a bf16 one 8 KiB).
// KV blocks in slots 0-39; coded blocks (25 to an f32 slot, 12 to a bf16 one) from slot 40 on: f32 slot 40 and
// bf16 slots 83-84 for the 20 used; codebook vectors (64 to an f32 slot, 32 to a bf16 one) from slot 45 on: f32
// slots 45-54 and bf16 slots 90-109 for up to 640 vectors.
constexpr int kCodebookSlots = 160, kKvSlots = 40, kCodedSlot = 40, kVectorSlot = 45;
constexpr int kRopePositions = 2048;

KvBlockLayout codebook_layout() { return KvBlockLayout{2, 64, 16, DType::f32}; }

// The stored form of a key whose direction before RoPE is x: x rotated at `position` with the view's table.
std::vector<float> rotated_key(const KvKeyRope& rope, int head_dim, std::vector<float> x, int32_t position) {
  const int half = head_dim / 2;
  const float* row = rope.table + int64_t(position) * head_dim;
  for (int i = 0; i < half; ++i) {
    const bool interleaved = rope.style == RopeStyle::interleaved;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float c = row[i], s = row[half + i], x0 = x[size_t(a)], x1 = x[size_t(b)];
    x[size_t(a)] = x0 * c - x1 * s;
    x[size_t(b)] = x1 * c + x0 * s;
  }
  return x;
}

std::vector<std::vector<float>> random_prototypes(int n, int head_dim, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> prototypes(size_t(n), std::vector<float>(static_cast<size_t>(head_dim)));
  for (auto& p : prototypes) {
    for (float& x : p) x = normal(rng);
  }
  return prototypes;
}

// Entries [0, n) of `table` in every KV head, keys and values alike: a prototype plus noise of one of several sizes
// (0: a scaled copy), times one of several lengths, so that groups form at high thresholds and low ones; keys
// stored after RoPE at their position. Rounded to bf16 and given to both pools.
void fill_clusters(TwinPool& pool, const std::vector<int32_t>& table, int n, const std::vector<int32_t>& positions,
                   const std::vector<std::vector<float>>& prototypes, std::mt19937& rng) {
  const KvBlockLayout& L = pool.cpu_layout;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float noise[] = {0.0f, 0.03f, 0.1f, 0.2f, 0.35f, 0.6f};
  const float lengths[] = {0.5f, 1.0f, 2.0f, 3.7f};
  auto direction = [&] {
    const std::vector<float>& p = prototypes[rng() % prototypes.size()];
    const float sigma = noise[rng() % 6], length = lengths[rng() % 4];
    std::vector<float> x(p.size());
    for (size_t c = 0; c < p.size(); ++c) x[c] = length * (p[c] + sigma * normal(rng));
    return x;
  };
  for (int e = 0; e < n; ++e) {
    float* block = pool.cpu.block_f32(table[size_t(e / L.block_size)]);
    const int slot = e % L.block_size;
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const std::vector<float> k = rotated_key(pool.cpu.key_rope, L.head_dim, direction(), positions[size_t(e)]);
      const std::vector<float> v = direction();
      for (int c = 0; c < L.head_dim; ++c) {
        block[L.k_offset(h, slot) + c] = round_bf16(k[size_t(c)]);
        block[L.v_offset(h, slot) + c] = round_bf16(v[size_t(c)]);
      }
    }
  }
  for (int32_t b : table) pool.upload(b);
}

// The first n_blocks of the KV slots, shuffled.
std::vector<int32_t> shuffled_table(int n_blocks, std::mt19937& rng) {
  std::vector<int32_t> slots(kKvSlots);
  for (int i = 0; i < kKvSlots; ++i) slots[size_t(i)] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(size_t(n_blocks));
  return slots;
}

std::vector<int32_t> random_positions(int n, std::mt19937& rng) {
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int32_t& p : positions) p = int32_t(rng() % kRopePositions);
  return positions;
}

int largest_group(const std::vector<int32_t>& assignment, int n_codes) {
  std::vector<int> size(size_t(n_codes), 0);
  for (int32_t code : assignment) ++size[size_t(code)];
  return n_codes > 0 ? *std::max_element(size.begin(), size.end()) : 0;
}

const char* style_name(RopeStyle style) { return style == RopeStyle::interleaved ? "interleaved" : "neox"; }

TEST_F(CudaKvCodebook, CodebookBuildMatchesTheCpu) {
  struct Case {
    int n;
    int n_prototypes;
  };
  // 600 entries around 2 prototypes: at the low threshold a step removes more than 255 entries, past what the
  // device's packed byte counters add in one pass.
  for (const Case& c : {Case{250, 12}, Case{600, 2}}) {
    for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
      TwinPool pool(codebook_layout(), kCodebookSlots);
      pool.set_key_rope(style, kRopePositions);
      const std::vector<int32_t> table = shuffled_table((c.n + 15) / 16, rng);
      const std::vector<int32_t> positions = random_positions(c.n, rng);
      fill_clusters(pool, table, c.n, positions, random_prototypes(c.n_prototypes, 64, rng), rng);
      for (KvPart part : {KvPart::key, KvPart::value}) {
        for (float threshold : {0.98f, 0.95f, 0.3f}) {
          SCOPED_TRACE(std::to_string(c.n) + " entries, " + style_name(style) +
                       (part == KvPart::key ? ", keys" : ", values") + ", threshold " + std::to_string(threshold));
          std::vector<int32_t> cpu_assignment(size_t(c.n)), cpu_centres(size_t(c.n));
          std::vector<int32_t> gpu_assignment(size_t(c.n), -1), gpu_centres(size_t(c.n), -1);
          const int cpu_codes = cpu->kv_codebook_build(table, 1, part, positions, threshold, pool.cpu, cpu_assignment,
                                                       cpu_centres);
          const int gpu_codes = gpu->kv_codebook_build(table, 1, part, positions, threshold, pool.gpu, gpu_assignment,
                                                       gpu_centres);
          ASSERT_EQ(gpu_codes, cpu_codes);
          EXPECT_EQ(gpu_assignment, cpu_assignment);
          cpu_centres.resize(size_t(cpu_codes));
          gpu_centres.resize(size_t(gpu_codes));
          EXPECT_EQ(gpu_centres, cpu_centres);
          EXPECT_LT(cpu_codes, c.n) << "no group formed: the case tests nothing";
          if (c.n_prototypes == 2 && threshold < 0.5f) {
            EXPECT_GT(largest_group(cpu_assignment, cpu_codes), 255);
          }
        }
      }
    }
  }
}

TEST_F(CudaKvCodebook, CodebookBuildOfOneEntryAndOfNone) {
  TwinPool pool(codebook_layout(), kCodebookSlots);
  pool.set_key_rope(RopeStyle::interleaved, kRopePositions);
  pool.fill(3, rng);
  const std::vector<int32_t> table = {3}, positions = {77};
  for (KvPart part : {KvPart::key, KvPart::value}) {
    for (Backend* backend : {cpu.get(), gpu.get()}) {
      const KvPoolView& view = backend == cpu.get() ? pool.cpu : pool.gpu;
      std::vector<int32_t> assignment(1, -1), centres(1, -1);
      EXPECT_EQ(backend->kv_codebook_build(table, 0, part, positions, 0.9f, view, assignment, centres), 1);
      EXPECT_EQ(assignment, (std::vector<int32_t>{0}));
      EXPECT_EQ(centres, (std::vector<int32_t>{0}));
      EXPECT_EQ(backend->kv_codebook_build(table, 0, part, {}, 0.9f, view, {}, {}), 0);
    }
  }
}

TEST_F(CudaKvCodebook, CodebookMatchMatchesTheCpu) {
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
    SCOPED_TRACE(style_name(style));
    TwinPool pool(codebook_layout(), kCodebookSlots);
    pool.set_key_rope(style, kRopePositions);
    const std::vector<int32_t> table = shuffled_table(13, rng);  // 208 entries
    const std::vector<int32_t> positions = random_positions(208, rng);
    const auto prototypes = random_prototypes(6, 64, rng);
    fill_clusters(pool, table, 208, positions, prototypes, rng);
    // 30 fp32 unit vectors near the prototypes; every third is named twice in the codebook, so that equal cosines
    // must resolve to the lower index.
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<int32_t> codebook;
    for (int j = 0; j < 30; ++j) {
      std::vector<float> v = prototypes[size_t(j % 6)];
      double sq = 0.0;
      for (float& x : v) {
        x += 0.2f * normal(rng);
        sq += double(x) * x;
      }
      for (float& x : v) x = float(x / std::sqrt(sq));
      codebook.push_back(pool.vector_id(kVectorSlot, j));
      pool.write_vector(codebook.back(), v);
    }
    for (int j = 0; j < 30; j += 3) codebook.push_back(codebook[size_t(j)]);
    std::vector<int32_t> entries;
    std::vector<int32_t> entry_positions;
    for (int e = 150; e < 208; ++e) {
      entries.push_back(e);
      entry_positions.push_back(positions[size_t(e)]);
    }
    const size_t m = entries.size();
    for (KvPart part : {KvPart::key, KvPart::value}) {
      SCOPED_TRACE(part == KvPart::key ? "keys" : "values");
      for (const std::vector<int32_t>& book : {codebook, std::vector<int32_t>{}}) {
        std::vector<float> cpu_similarity(m), gpu_similarity(m);
        std::vector<int32_t> cpu_index(m), gpu_index(m);
        cpu->kv_codebook_match(table, 1, part, entries, entry_positions, book, pool.cpu, cpu_similarity, cpu_index);
        gpu->kv_codebook_match(table, 1, part, entries, entry_positions, book, pool.gpu, gpu_similarity, gpu_index);
        EXPECT_EQ(gpu_index, cpu_index);
        EXPECT_EQ(gpu_similarity, cpu_similarity);
        if (book.empty()) {
          EXPECT_EQ(cpu_index, std::vector<int32_t>(m, -1));
          EXPECT_EQ(cpu_similarity, std::vector<float>(m, -INFINITY));
        }
      }
    }
  }
}

// The codebook replacement of a layer of 200 entries in both KV heads as KvCache does it (new vectors for the
// build's centres, the 12 full groups coded, the partial one written back), then entry 200 appended to head 1
// with a new key vector and an existing value vector.
TEST_F(CudaKvCodebook, CodebookEncodeMatchesTheCpu) {
  constexpr int kEntries = 200, kBlock = 16, kGroups = (kEntries + kBlock - 1) / kBlock;
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
    SCOPED_TRACE(style_name(style));
    TwinPool pool(codebook_layout(), kCodebookSlots);
    pool.set_key_rope(style, kRopePositions);
    const std::vector<int32_t> table = shuffled_table(kGroups, rng);
    const std::vector<int32_t> positions = random_positions(kEntries + 1, rng);
    fill_clusters(pool, table, kEntries + 1, positions, random_prototypes(8, 64, rng), rng);
    std::vector<int32_t> coded;
    for (int g = 0; g < kGroups; ++g) coded.push_back(pool.packed_id(kCodedSlot, g));
    int n_vectors = 0;
    auto next_vector = [&] { return pool.vector_id(kVectorSlot, n_vectors++); };

    const std::vector<int32_t> layer_positions(positions.begin(), positions.begin() + kEntries);
    KvCodebookEncoding last;
    for (int h = 0; h < 2; ++h) {
      KvCodebookEncoding e;
      e.head = h;
      e.positions = layer_positions;
      e.coded_blocks = coded;
      e.write_back_from = (kEntries / kBlock) * kBlock;
      for (KvPart part : {KvPart::key, KvPart::value}) {
        std::vector<int32_t> assignment(kEntries), centres(kEntries);
        const float threshold = part == KvPart::key ? 0.95f : 0.9f;
        const int n_codes = cpu->kv_codebook_build(table, h, part, layer_positions, threshold, pool.cpu, assignment,
                                                   centres);
        std::vector<int32_t> ids;
        for (int c = 0; c < n_codes; ++c) {
          ids.push_back(next_vector());
          (part == KvPart::key ? e.new_k_entries : e.new_v_entries).push_back(centres[size_t(c)]);
          (part == KvPart::key ? e.new_k_vectors : e.new_v_vectors).push_back(ids.back());
        }
        for (int32_t code : assignment) (part == KvPart::key ? e.k_vectors : e.v_vectors).push_back(ids[size_t(code)]);
      }
      cpu->kv_codebook_encode(table, e, pool.cpu);
      gpu->kv_codebook_encode(table, e, pool.gpu);
      last = e;
    }
    KvCodebookEncoding appended;
    appended.head = 1;
    appended.entry_begin = kEntries;
    appended.positions = {positions[kEntries]};
    appended.k_vectors = {next_vector()};
    appended.new_k_entries = {kEntries};
    appended.new_k_vectors = appended.k_vectors;
    appended.v_vectors = {last.v_vectors[0]};
    appended.coded_blocks = {coded[kEntries / kBlock]};
    appended.write_back_from = kEntries;
    cpu->kv_codebook_encode(table, appended, pool.cpu);
    gpu->kv_codebook_encode(table, appended, pool.gpu);

    const DevicePoolCopy copy(pool);
    const KvPoolView& device = copy.reader.view;
    int rows_differ = 0, vectors_differ = 0, entries_differ = 0;
    for (int32_t id : coded) {
      for (int i = 0; i < 2 * kBlock; ++i) {  // both heads' rows; rows never coded are zero on both sides
        const KvCodeRow a = device.block_coded(id)[i], b = pool.cpu.block_coded(id)[i];
        rows_differ += a.k_vector != b.k_vector || a.k_magnitude != b.k_magnitude || a.v_vector != b.v_vector ||
                       a.v_magnitude != b.v_magnitude || a.position != b.position;
      }
    }
    for (int v = 0; v < n_vectors; ++v) {
      const int32_t id = pool.vector_id(kVectorSlot, v);
      for (int c = 0; c < 64; ++c) vectors_differ += device.codebook_vector(id)[c] != pool.cpu.codebook_vector(id)[c];
    }
    const PoolReader host{pool.cpu};
    for (int32_t b : table) {
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < kBlock; ++s) {
          for (int c = 0; c < 64; ++c) {
            for (bool key : {true, false}) {
              entries_differ += copy.reader.at(b, key, h, s, c) != round_bf16(host.at(b, key, h, s, c));
            }
          }
        }
      }
    }
    EXPECT_EQ(rows_differ, 0);
    EXPECT_EQ(vectors_differ, 0);
    EXPECT_EQ(entries_differ, 0);
  }
}

// Runs op(backend, view) on both backends and expects Exception from each.
template <class Exception, class Op>
void expect_throw_on_both(Backend& cpu, Backend& gpu, const TwinPool& pool, Op op) {
  EXPECT_THROW(op(cpu, pool.cpu), Exception) << "cpu";
  EXPECT_THROW(op(gpu, pool.gpu), Exception) << "cuda";
}

TEST_F(CudaKvCodebook, CodebookErrorsAreTheCpus) {
  TwinPool pool(codebook_layout(), kCodebookSlots);
  pool.set_key_rope(RopeStyle::interleaved, kRopePositions);
  pool.fill(0, rng);
  pool.fill(1, rng);
  const int32_t coded = pool.packed_id(kCodedSlot, 0), vector = pool.vector_id(kVectorSlot, 0);
  const std::vector<int32_t> table = {0, 1}, positions = {3, 9, 2047};
  auto encoding = [&] {
    KvCodebookEncoding e;
    e.positions = positions;
    e.k_vectors = {vector, vector, vector};
    e.v_vectors = {vector, vector, vector};
    e.new_k_entries = {1};
    e.new_k_vectors = {vector};
    e.coded_blocks = {coded};
    return e;
  };
  std::vector<int32_t> out(3);
  std::vector<float> similarity(1);
  std::vector<int32_t> index(1);

  // Outputs of the wrong size.
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    std::vector<int32_t> short_assignment(2);
    b.kv_codebook_build(table, 0, KvPart::value, positions, 0.9f, view, short_assignment, out);
  });
  // Positions outside the key RoPE table (the values' positions are not read).
  for (int32_t bad : {-1, kRopePositions}) {
    const std::vector<int32_t> bad_positions = {3, bad, 5};
    expect_throw_on_both<std::out_of_range>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
      b.kv_codebook_build(table, 0, KvPart::key, bad_positions, 0.9f, view, out, out);
    });
    expect_throw_on_both<std::out_of_range>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
      b.kv_codebook_match(table, 0, KvPart::key, std::vector<int32_t>{4}, std::vector<int32_t>{bad},
                          std::vector<int32_t>{vector}, view, similarity, index);
    });
    expect_throw_on_both<std::out_of_range>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
      KvCodebookEncoding e = encoding();
      e.positions[2] = bad;
      b.kv_codebook_encode(table, e, view);
    });
  }
  // An entry in a coded block (std::logic_error on the CPU, std::invalid_argument, one of those, on the device).
  expect_throw_on_both<std::logic_error>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    const std::vector<int32_t> coded_table = {0, coded};
    std::vector<int32_t> assignment(17), centres(17);
    b.kv_codebook_build(coded_table, 0, KvPart::value, std::vector<int32_t>(17, 0), 0.9f, view, assignment, centres);
  });
  // Encodings: vector ids short of the entries, a new vector from an entry that is not encoded, no coded block,
  // and a coded block that is a full-precision slot.
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.v_vectors.pop_back();
    b.kv_codebook_encode(table, e, view);
  });
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.new_k_entries = {3};
    b.kv_codebook_encode(table, e, view);
  });
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.coded_blocks.clear();
    b.kv_codebook_encode(table, e, view);
  });
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.coded_blocks = {1};
    b.kv_codebook_encode(table, e, view);
  });
  // The device writes new vectors in parallel: one named twice is refused (the CPU keeps the last).
  KvCodebookEncoding twice = encoding();
  twice.new_v_entries = {2};
  twice.new_v_vectors = {vector};
  EXPECT_THROW(gpu->kv_codebook_encode(table, twice, pool.gpu), std::invalid_argument);
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
