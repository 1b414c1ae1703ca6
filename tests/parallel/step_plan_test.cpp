#include "parallel/step_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

SamplingRule full_sampling() {
  SamplingRule s;
  s.temperature = 0.7f;
  s.top_p = 0.9f;
  s.top_k = 40;
  s.min_p = 0.05f;
  s.presence_penalty = -1.5f;
  s.frequency_penalty = 2.0f;
  s.n_logprobs = 5;
  s.logit_bias = {{3, -2.5f}, {70000, 100.0f}};
  return s;
}

StepPlan full_plan() {
  StepPlan p;
  p.step = 0x123456789abcULL;
  p.shutdown = true;
  p.report_detail = true;
  PlannedSequence a;
  a.seq = 42;
  a.sampling = full_sampling();
  a.seed = 987654321987ULL;
  a.kv_policy = PolicySpec{"snapkv", {{"budget", "20%"}, {"window", "8"}}};
  a.prompt_len = 300;
  PlannedSequence b;
  b.seq = -7;
  b.sampling = full_sampling();
  b.sampling.temperature = 0.0f;
  b.sampling.n_logprobs = -1;
  b.seed = 0;
  b.kv_policy = std::nullopt;
  b.prompt_len = 1;
  p.added = {a, b};
  p.preempted = {3, int64_t(1) << 40};
  p.finished = {std::numeric_limits<int64_t>::min(), 0, std::numeric_limits<int64_t>::max()};
  PlannedWork w1;
  w1.seq = 42;
  w1.start_pos = 0;
  w1.tokens = {1, 2, 3, -1, std::numeric_limits<int32_t>::max()};
  w1.sample = false;
  w1.prefill_len = 300;
  w1.n_scoring = 2;
  PlannedWork w2;
  w2.seq = 9;
  w2.start_pos = 4096;
  w2.tokens = {};
  w2.sample = true;
  w2.prefill_len = 0;
  w2.allowed = {0x8000000000000001ULL, 0, ~uint64_t(0)};
  p.work = {w1, w2};
  p.prefix_evicted = {1, ~uint64_t(0)};
  p.prefix_started = {PrefixStart{42, {0xfeedULL, 7}, 300, true}, PrefixStart{9, {}, 0},
                      PrefixStart{11, {3, 4}, 1500, false, 1024}};
  p.prefix_published = {PrefixPublish{42, 2, 0x123456789abcdef0ULL}, PrefixPublish{11, 0, 5, true}};
  return p;
}

void expect_sampling_eq(const SamplingRule& a, const SamplingRule& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.n_logprobs, b.n_logprobs);
  ASSERT_EQ(a.logit_bias.size(), b.logit_bias.size());
  for (size_t i = 0; i < a.logit_bias.size(); ++i) {
    EXPECT_EQ(a.logit_bias[i].id, b.logit_bias[i].id);
    EXPECT_EQ(a.logit_bias[i].amount, b.logit_bias[i].amount);
  }
}

void expect_plan_eq(const StepPlan& a, const StepPlan& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.shutdown, b.shutdown);
  EXPECT_EQ(a.report_detail, b.report_detail);
  ASSERT_EQ(a.added.size(), b.added.size());
  for (size_t i = 0; i < a.added.size(); ++i) {
    SCOPED_TRACE("added " + std::to_string(i));
    EXPECT_EQ(a.added[i].seq, b.added[i].seq);
    expect_sampling_eq(a.added[i].sampling, b.added[i].sampling);
    EXPECT_EQ(a.added[i].seed, b.added[i].seed);
    EXPECT_EQ(a.added[i].kv_policy, b.added[i].kv_policy);
    EXPECT_EQ(a.added[i].prompt_len, b.added[i].prompt_len);
  }
  EXPECT_EQ(a.preempted, b.preempted);
  EXPECT_EQ(a.finished, b.finished);
  EXPECT_EQ(a.prefix_evicted, b.prefix_evicted);
  EXPECT_TRUE(a.prefix_started == b.prefix_started);
  EXPECT_TRUE(a.prefix_published == b.prefix_published);
  ASSERT_EQ(a.work.size(), b.work.size());
  for (size_t i = 0; i < a.work.size(); ++i) {
    SCOPED_TRACE("work " + std::to_string(i));
    EXPECT_EQ(a.work[i].seq, b.work[i].seq);
    EXPECT_EQ(a.work[i].start_pos, b.work[i].start_pos);
    EXPECT_EQ(a.work[i].tokens, b.work[i].tokens);
    EXPECT_EQ(a.work[i].sample, b.work[i].sample);
    EXPECT_EQ(a.work[i].prefill_len, b.work[i].prefill_len);
    EXPECT_EQ(a.work[i].allowed, b.work[i].allowed);
    EXPECT_EQ(a.work[i].n_scoring, b.work[i].n_scoring);
  }
}

StepResult full_result() {
  StepResult r;
  r.step = 77;
  SampledToken a;
  a.seq = 42;
  a.sample.id = 31999;
  a.sample.logprob = -0.125f;
  a.sample.top = {{31999, -0.125f}, {5, -2.5f}, {17, -std::numeric_limits<float>::infinity()}};
  SampledToken b;
  b.seq = -3;
  b.sample.id = 0;
  b.sample.logprob = 0.0f;
  r.sampled = {a, b};
  return r;
}

void expect_result_eq(const StepResult& a, const StepResult& b) {
  EXPECT_EQ(a.step, b.step);
  ASSERT_EQ(a.sampled.size(), b.sampled.size());
  for (size_t i = 0; i < a.sampled.size(); ++i) {
    EXPECT_EQ(a.sampled[i].seq, b.sampled[i].seq);
    const RowSample& x = a.sampled[i].sample;
    const RowSample& y = b.sampled[i].sample;
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.logprob, y.logprob);
    ASSERT_EQ(x.top.size(), y.top.size());
    for (size_t k = 0; k < x.top.size(); ++k) {
      EXPECT_EQ(x.top[k].id, y.top[k].id);
      EXPECT_EQ(x.top[k].logprob, y.top[k].logprob);
    }
  }
}

// The message must be rejected with a std::runtime_error whose text names an offset.
template <typename F>
void expect_offset_error(F&& parse, const std::string& what) {
  try {
    parse();
    ADD_FAILURE() << what << ": no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << what << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw something other than std::runtime_error: " << e.what();
  }
}

TEST(StepPlan, RoundTripWithEveryFieldSet) {
  const StepPlan p = full_plan();
  const StepPlan back = deserialize_step_plan(serialize(p));
  expect_plan_eq(p, back);
  // Spot checks that do not depend on the comparison helper.
  ASSERT_EQ(back.added.size(), 2u);
  EXPECT_EQ(back.added[0].seed, 987654321987ULL);
  EXPECT_EQ(back.added[0].sampling.top_k, 40);
  EXPECT_EQ(back.added[1].sampling.temperature, 0.0f);
  EXPECT_EQ(back.added[1].sampling.n_logprobs, -1);
  EXPECT_TRUE(back.shutdown);
  EXPECT_TRUE(back.report_detail);
  EXPECT_TRUE(back.work[1].tokens.empty());
  EXPECT_EQ(back.work[1].allowed.size(), 3u);
  EXPECT_TRUE(back.work[0].allowed.empty());
}

TEST(StepPlan, RoundTripOfAnEmptyPlan) {
  const StepPlan p;
  const StepPlan back = deserialize_step_plan(serialize(p));
  expect_plan_eq(p, back);
  EXPECT_FALSE(back.shutdown);
}

TEST(StepPlan, SerialisationIsDeterministic) {
  EXPECT_EQ(serialize(full_plan()), serialize(full_plan()));
  EXPECT_EQ(serialize(full_result()), serialize(full_result()));
}

TEST(StepPlan, TruncationAtEveryCutPointThrowsNamingTheOffset) {
  const std::vector<uint8_t> bytes = serialize(full_plan());
  ASSERT_GT(bytes.size(), 100u);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    const std::vector<uint8_t> part(bytes.begin(), bytes.begin() + ptrdiff_t(cut));
    expect_offset_error([&] { deserialize_step_plan(part); }, "plan cut at " + std::to_string(cut));
  }
}

TEST(StepPlan, WrongMagicIsRejected) {
  std::vector<uint8_t> bytes = serialize(full_plan());
  bytes[0] ^= 0xff;
  EXPECT_THROW(deserialize_step_plan(bytes), std::runtime_error);
  // A result is not a plan, and a plan is not a result.
  EXPECT_THROW(deserialize_step_plan(serialize(full_result())), std::runtime_error);
  EXPECT_THROW(deserialize_step_result(serialize(full_plan())), std::runtime_error);
}

TEST(StepPlan, TrailingBytesAreRejected) {
  for (size_t extra : {1u, 7u}) {
    std::vector<uint8_t> bytes = serialize(full_plan());
    bytes.insert(bytes.end(), extra, 0);
    expect_offset_error([&] { deserialize_step_plan(bytes); }, "plan with trailing bytes");
    std::vector<uint8_t> r = serialize(full_result());
    r.insert(r.end(), extra, 0);
    expect_offset_error([&] { deserialize_step_result(r); }, "result with trailing bytes");
  }
}

TEST(StepPlan, CorruptCountsThrowInsteadOfAllocating) {
  // Every 4-byte window set to 0xffffffff: a count that large must be rejected by the bounds check (or the
  // message otherwise fails to parse), never crash or try to allocate billions of elements.
  const std::vector<uint8_t> bytes = serialize(full_plan());
  for (size_t at = 4; at + 4 <= bytes.size(); ++at) {
    std::vector<uint8_t> bad = bytes;
    for (size_t i = 0; i < 4; ++i) bad[at + i] = 0xff;
    try {
      deserialize_step_plan(bad);
    } catch (const std::runtime_error&) {
    }
  }
  SUCCEED();
}

// Found by tests/fuzz/step_plan_fuzz.cpp: a policy parameter given twice was accepted, keeping one of the values.
TEST(StepPlan, RepeatedPolicyParameterIsRejected) {
  std::vector<uint8_t> bytes = serialize(full_plan());  // the first sequence's policy: budget=20%, window=8
  const std::string window = "window", budget = "budget";
  auto at = std::search(bytes.begin(), bytes.end(), window.begin(), window.end());
  ASSERT_NE(at, bytes.end());
  std::copy(budget.begin(), budget.end(), at);
  try {
    deserialize_step_plan(bytes);
    ADD_FAILURE() << "a repeated policy parameter was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'budget' repeated"), std::string::npos) << e.what();
  }
}

// Scoring rows follow a chunk's own tokens and sample nothing: more than the work has but one, or on work that
// samples, is the leader's error.
TEST(StepPlan, ScoringRowsBeyondTheChunkOrOnSampledWorkAreRejected) {
  for (const auto& [n_scoring, sample] : {std::pair{5, false}, std::pair{-1, false}, std::pair{2, true}}) {
    StepPlan plan = full_plan();
    plan.work[0].n_scoring = n_scoring;
    plan.work[0].sample = sample;
    try {
      deserialize_step_plan(serialize(plan));
      ADD_FAILURE() << n_scoring << " scoring rows of 5 tokens were accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("scoring rows among 5 tokens"), std::string::npos) << e.what();
    }
  }
}

// A mask belongs to the token a work item samples: on work that samples nothing the leader made an error.
TEST(StepPlan, AMaskOnWorkThatSamplesNothingIsRejected) {
  StepPlan plan = full_plan();
  plan.work[0].allowed = {1};  // work 0 (sequence 42) does not sample
  try {
    deserialize_step_plan(serialize(plan));
    ADD_FAILURE() << "a mask on work that samples nothing was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 42 carries a mask"), std::string::npos) << e.what();
  }
}

// A mask travels as its bitset, its allowed ids or its refused ids, whichever is shortest, and comes back the same.
TEST(StepPlan, MasksTravelInTheirShortestForm) {
  constexpr size_t kWords = 768;  // SmolLM2's 49,152 tokens
  std::vector<uint64_t> one_token(kWords, 0), all_but_two(kWords, ~uint64_t{0}), half(kWords, 0x5555555555555555ULL);
  one_token[100] = uint64_t{1} << 7;
  all_but_two[0] &= ~uint64_t{1};
  all_but_two[767] &= ~(uint64_t{1} << 63);
  for (const auto& [mask, most_bytes] : {std::pair{one_token, size_t(16)}, std::pair{all_but_two, size_t(20)},
                                         std::pair{half, kWords * 8 + 8}}) {
    StepPlan plan;
    plan.work.push_back(PlannedWork{7, 3, {5}, true, 0, mask});
    const std::vector<uint8_t> bytes = serialize(plan);
    plan.work[0].allowed.clear();
    const size_t without = serialize(plan).size();
    EXPECT_LE(bytes.size() - without, most_bytes);
    EXPECT_EQ(deserialize_step_plan(bytes).work[0].allowed, mask);
  }
}

// One message, one encoding: a mask sent as a bitset that its allowed ids would carry in fewer bytes is refused
// (found by tests/fuzz/step_plan_fuzz.cpp, which re-encodes what it decodes).
TEST(StepPlan, AMaskNotInItsShortestFormIsRejected) {
  StepPlan plan;
  const std::vector<uint64_t> half(4, 0x5555555555555555ULL);
  plan.work.push_back(PlannedWork{7, 3, {5}, true, 0, half});
  std::vector<uint8_t> bytes = serialize(plan);
  const uint64_t pattern = 0x5555555555555555ULL;
  auto at = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const uint8_t*>(&pattern),
                        reinterpret_cast<const uint8_t*>(&pattern) + 8);
  ASSERT_NE(at, bytes.end());
  const std::vector<uint64_t> one_token = {1, 0, 0, 0};  // still as a bitset
  std::memcpy(&*at, one_token.data(), 32);
  try {
    deserialize_step_plan(bytes);
    ADD_FAILURE() << "a mask in a longer form than its shortest was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("shortest form"), std::string::npos) << e.what();
  }
}

TEST(StepResult, RoundTripWithEveryFieldSet) {
  const StepResult r = full_result();
  const StepResult back = deserialize_step_result(serialize(r));
  expect_result_eq(r, back);
  ASSERT_EQ(back.sampled.size(), 2u);
  EXPECT_EQ(back.sampled[0].sample.top[2].logprob, -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(back.sampled[1].sample.top.empty());
  const StepResult empty;
  expect_result_eq(empty, deserialize_step_result(serialize(empty)));
}

TEST(StepResult, TruncationAtEveryCutPointThrowsNamingTheOffset) {
  const std::vector<uint8_t> bytes = serialize(full_result());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    const std::vector<uint8_t> part(bytes.begin(), bytes.begin() + ptrdiff_t(cut));
    expect_offset_error([&] { deserialize_step_result(part); }, "result cut at " + std::to_string(cut));
  }
}

TEST(StepResult, WrongMagicIsRejected) {
  std::vector<uint8_t> bytes = serialize(full_result());
  bytes[3] ^= 0x01;
  EXPECT_THROW(deserialize_step_result(bytes), std::runtime_error);
}

}  // namespace
}  // namespace strata
