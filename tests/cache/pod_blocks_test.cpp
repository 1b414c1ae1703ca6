// PoD's layer grouping (Algorithm 1 with sim = 1 - JS2) on given similarity matrices, computed by hand, and the
// blocks file: round trip and the errors that name the file and the key.
#include "cache/pod_blocks.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(PodSimilarity, JensenShannonBase2) {
  const float a[] = {1.0f, 0.0f}, b[] = {0.0f, 1.0f}, c[] = {0.5f, 0.5f};
  EXPECT_NEAR(js_similarity(a, a, 2), 1.0, 1e-12);
  EXPECT_NEAR(js_similarity(a, b, 2), 0.0, 1e-12);  // disjoint rows: JS2 = 1
  // m = (0.75, 0.25): KL(c||m) = 0.5 log2(2/3) + 0.5 log2 2 = 0.2075; KL(a||m) = log2(4/3) = 0.4150; JS = 0.3113.
  EXPECT_NEAR(js_similarity(c, a, 2), 1.0 - 0.5 * (0.5 * std::log2(2.0 / 3.0) + 0.5 + std::log2(4.0 / 3.0)), 1e-9);
  EXPECT_NEAR(js_similarity(c, a, 2), 0.688722, 1e-6);
}

TEST(PodGrouping, CompleteLinkageAgainstTheWholeBlock) {
  // Layer 2 is close to layer 1 (0.9) but not to layer 0 (0.4): with δ = 0.5 it opens a block, although a
  // chain rule (previous layer only) would have let it join. Layer 3 joins layer 2; layer 4 is far from 3.
  const std::vector<std::vector<double>> sim = {
      {1.0, 0.8, 0.4, 0.3, 0.2},
      {0.8, 1.0, 0.9, 0.3, 0.2},
      {0.4, 0.9, 1.0, 0.7, 0.1},
      {0.3, 0.3, 0.7, 1.0, 0.45},
      {0.2, 0.2, 0.1, 0.45, 1.0},
  };
  EXPECT_EQ(group_layers(sim, 0.5), (std::vector<int>{0, 0, 2, 2, 4}));
  EXPECT_EQ(group_layers(sim, 0.35), (std::vector<int>{0, 0, 0, 3, 3}));  // 2 joins (0.4, 0.9); 3 fails vs 0, 1
  EXPECT_EQ(group_layers(sim, 0.95), (std::vector<int>{0, 1, 2, 3, 4}));   // every layer its own leader
  EXPECT_EQ(group_layers(sim, 0.0), (std::vector<int>{0, 0, 0, 0, 0}));
  // A stage boundary at layer 1 forces a block to start there.
  EXPECT_EQ(group_layers(sim, 0.0, {1}), (std::vector<int>{0, 1, 1, 1, 1}));
}

TEST(PodGrouping, StageStartsFollowTheRankGrid) {
  EXPECT_EQ(stage_starts(30, 1), std::vector<int>{});
  EXPECT_EQ(stage_starts(30, 4), (std::vector<int>{8, 16, 23}));  // 8, 8, 7, 7
  EXPECT_EQ(stage_starts(30, 2), (std::vector<int>{15}));
}

PodBlocks sample() {
  PodBlocks b;
  b.model = "tiny";
  b.n_layers = 6;
  b.n_kv_heads = 2;
  b.threshold = 0.625;
  b.leader = {{0, 0, 0, 3, 3, 5}, {0, 1, 1, 3, 3, 3}};
  return b;
}

std::string write_temp(const std::string& text) {
  const std::string path = ::testing::TempDir() + "pod_blocks_test.txt";
  std::ofstream(path) << text;
  return path;
}

TEST(PodBlocksFile, RoundTripAndSaving) {
  const PodBlocks b = sample();
  EXPECT_EQ(format_pod_blocks(b).substr(format_pod_blocks(b).find("head 0")), "head 0: 0-2 3-4 5\nhead 1: 0 1-2 3-5\n");
  const std::string path = write_temp(format_pod_blocks(b));
  const PodBlocks r = read_pod_blocks(path);
  EXPECT_EQ(r.leader, b.leader);
  EXPECT_EQ(r.model, "tiny");
  EXPECT_DOUBLE_EQ(r.threshold, 0.625);
  EXPECT_EQ(r.n_blocks(0), 3);
  // Layers whose both heads follow: 2 and 4 → 2 / (2 * 6); for head 1 alone: 2, 4, 5 → 3 / 12.
  EXPECT_DOUBLE_EQ(pod_asymptotic_saving(r, 0, 2), 2.0 / 12.0);
  EXPECT_DOUBLE_EQ(pod_asymptotic_saving(r, 1, 2), 3.0 / 12.0);
  EXPECT_NO_THROW(check_pod_blocks(r, path, "tiny", 6, 2, 2));  // stages [0,3), [3,6): 3 leads in both heads
}

void expect_error(const std::string& text, const std::string& needle) {
  const std::string path = write_temp(text);
  try {
    read_pod_blocks(path);
    FAIL() << "no error for " << text;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(PodBlocksFile, ErrorsNameTheFileAndTheKey) {
  expect_error("model m\nlayers 3\nkv_heads 1\nhead 0: 0 2\n", "must start at layer 1");
  expect_error("model m\nlayers 3\nkv_heads 1\nhead 0: 0-1\n", "end at layer 2, not at layer 3");
  expect_error("model m\nlayers x\n", "layers: expected an integer");
  expect_error("model m\nlayers 3\nkv_heads 2\nhead 0: 0-2\n", "head: 1 lines for kv_heads 2");
  expect_error("model m\nlayer 3\n", "layer: unknown key");
  const PodBlocks b = sample();
  auto message = [&](const std::string& model, int layers, int heads, int pp) {
    try {
      check_pod_blocks(b, "blocks.txt", model, layers, heads, pp);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message("other", 6, 2, 1), "blocks.txt: model: the blocks were calibrated on 'tiny', the model is 'other'");
  EXPECT_EQ(message("tiny", 30, 2, 1), "blocks.txt: layers: 6, the model has 30");
  EXPECT_EQ(message("tiny", 6, 3, 1), "blocks.txt: kv_heads: 2, the model has 3");
  // pp = 3: stages start at 2 and 4; head 0's block 0-2 crosses layer 2.
  EXPECT_NE(message("tiny", 6, 2, 3).find("head 0: the block 0-... crosses the boundary of pipeline stages at layer 2"),
            std::string::npos);
}

}  // namespace
}  // namespace strata
