// The scheduler against a real KvCache over a small pool (and against several pipeline stages at the end). Block size 4 everywhere, so block counts are easy to
// follow: a sequence holding e entries in one layer holds ceil(e / 4) blocks there.
#include "leader/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "rank/rank_reporter.h"

namespace strata {
namespace {

constexpr int kBlockSize = 4;

KvBlockLayout layout() {
  KvBlockLayout L;
  L.n_kv_heads = 1;
  L.head_dim = 2;
  L.block_size = kBlockSize;
  return L;
}

struct Bed {
  std::unique_ptr<Backend> be = make_cpu_backend();
  BlockPool pool;
  KvCache cache;
  explicit Bed(int64_t n_blocks, int n_layers = 1) : pool(*be, layout(), n_blocks), cache(pool, 0, n_layers) {}

  // A running sequence with n_cached entries in the cache and n_tokens known.
  SchedulerSequence running(SeqId id, int n_tokens, int n_cached) {
    cache.append(id, n_cached);
    return {id, n_tokens, n_cached};
  }

  // The scheduler's view: one pipeline stage, this cache (the tests' sequence ids are below 64).
  PipelineKv kv() const {
    std::vector<SeqId> ids(64);
    for (SeqId id = 0; id < 64; ++id) ids[size_t(id)] = id;
    return PipelineKv({kv_report(cache, ids)});
  }
};

SchedulerLimits limits(int max_running, int max_batch_tokens, double watermark = 0.0) {
  SchedulerLimits l;
  l.max_running = max_running;
  l.max_batch_tokens = max_batch_tokens;
  l.watermark = watermark;
  return l;
}

std::vector<std::tuple<SeqId, int, int>> chunks_of(const Schedule& s) {
  std::vector<std::tuple<SeqId, int, int>> out;
  for (const ScheduledChunk& c : s.chunks) out.emplace_back(c.id, c.start, c.n);
  return out;
}

using Chunks = std::vector<std::tuple<SeqId, int, int>>;
using Ids = std::vector<SeqId>;
const std::vector<SeqId> kNone;  // no finished sequence releasing its blocks in the step

TEST(Scheduler, DecodesComeFirstAndTakeOneTokenEach) {
  Bed bed(100);
  const std::vector<SchedulerSequence> running = {
      bed.running(1, 10, 9),   // decoding
      bed.running(3, 50, 16),  // in the middle of its prompt
      bed.running(2, 6, 5),    // decoding
  };
  const std::deque<SchedulerSequence> waiting = {{4, 8, 0}};
  const Schedule s = schedule_step(running, waiting, kNone, bed.kv(), limits(16, 20));
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 9, 1}, {2, 5, 1}, {3, 16, 18}}));
  EXPECT_TRUE(s.admitted.empty());  // the budget is spent
  EXPECT_TRUE(s.preempted.empty());
  EXPECT_TRUE(s.unservable.empty());
}

TEST(Scheduler, DecodesAloneWhenTheBudgetIsSmall) {
  Bed bed(100);
  const std::vector<SchedulerSequence> running = {bed.running(1, 10, 9), bed.running(2, 30, 8), bed.running(3, 6, 5)};
  const Schedule s = schedule_step(running, {}, kNone, bed.kv(), limits(16, 2));
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 9, 1}, {3, 5, 1}}));
}

TEST(Scheduler, PrefillTakesWhatTheDecodesLeave) {
  Bed bed(100);
  const std::vector<SchedulerSequence> running = {bed.running(1, 10, 9), bed.running(2, 7, 6)};
  const std::deque<SchedulerSequence> waiting = {{5, 100, 0}, {6, 3, 0}};
  const Schedule s = schedule_step(running, waiting, kNone, bed.kv(), limits(16, 32));
  EXPECT_EQ(s.admitted, (Ids{5}));
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 9, 1}, {2, 6, 1}, {5, 0, 30}}));
}

// ---------------------------------------------------------------------------------------------------------------
// A small engine loop around schedule_step: it applies every schedule to the cache as the engine does (release the
// sequences that finished in the previous step, the unservable and the preempted, admit, then append every chunk)
// and checks the schedule's promises on the way.

struct SimSeq {
  SeqId id = 0;
  int prompt = 0;
  int max_new = 0;
  int generated = 0;
  int n_cached = 0;
  int n_tokens() const { return prompt + generated; }
};

struct Sim {
  Sim(Bed& b, SchedulerLimits l) : bed(b), lim(l) {}
  Bed& bed;
  SchedulerLimits lim;
  std::map<SeqId, SimSeq> seqs;
  std::vector<SeqId> running;
  std::deque<SeqId> waiting;
  std::vector<SeqId> finished, unservable;
  std::vector<SeqId> releasing;  // finished in the last step; their blocks go back at the start of the next
  std::vector<Schedule> history;
  int64_t n_preemptions = 0;

  void arrive(SeqId id, int prompt, int max_new) {
    seqs[id] = SimSeq{id, prompt, max_new, 0, 0};
    waiting.push_back(id);
  }
  bool idle() const { return running.empty() && waiting.empty(); }
  void drain() {
    for (SeqId id : releasing) bed.cache.release(id);
    releasing.clear();
  }

  SchedulerSequence view(SeqId id) const {
    const SimSeq& s = seqs.at(id);
    return {id, s.n_tokens(), s.n_cached};
  }

  // Runs one step; a broken rule is a fatal test failure (callers check HasFatalFailure()).
  void step() {
    std::vector<SchedulerSequence> run;
    for (SeqId id : running) run.push_back(view(id));
    std::deque<SchedulerSequence> wait;
    for (SeqId id : waiting) wait.push_back(view(id));
    const Schedule s = schedule_step(run, wait, releasing, bed.kv(), lim);
    history.push_back(s);

    const std::set<SeqId> was_running(running.begin(), running.end());
    // Admission: a prefix of the waiting queue, never in a step that preempted.
    ASSERT_LE(s.admitted.size(), waiting.size());
    for (size_t i = 0; i < s.admitted.size(); ++i) ASSERT_EQ(s.admitted[i], waiting[i]) << "admitted out of order";
    if (!s.preempted.empty()) {
      ASSERT_TRUE(s.admitted.empty()) << "admitted in a step that preempted";
    }
    for (SeqId id : s.preempted) ASSERT_TRUE(was_running.count(id)) << "preempted " << id << " was not running";
    for (SeqId id : s.unservable) ASSERT_TRUE(was_running.count(id)) << "unservable " << id << " was not running";

    drain();
    for (SeqId id : s.unservable) {
      bed.cache.release(id);
      std::erase(running, id);
      unservable.push_back(id);
    }
    for (SeqId id : s.preempted) {
      bed.cache.release(id);
      seqs[id].n_cached = 0;
      std::erase(running, id);
      waiting.push_front(id);
      ++n_preemptions;
    }
    for (SeqId id : s.admitted) {
      std::erase(waiting, id);
      running.push_back(id);
    }
    ASSERT_LE(int(running.size()), lim.max_running);

    // Chunks: at most one per running sequence, decodes take one token, starts follow the cache, the budget holds
    // and the blocks were there for every chunk, one after the other.
    int tokens = 0;
    std::set<SeqId> seen;
    for (const ScheduledChunk& c : s.chunks) {
      ASSERT_TRUE(std::find(running.begin(), running.end(), c.id) != running.end()) << "chunk for " << c.id;
      ASSERT_TRUE(seen.insert(c.id).second) << "two chunks for " << c.id;
      SimSeq& q = seqs.at(c.id);
      ASSERT_EQ(c.start, q.n_cached) << "seq " << c.id;
      ASSERT_GE(c.n, 1) << "seq " << c.id;
      ASSERT_LE(c.n, q.n_tokens() - q.n_cached) << "seq " << c.id;
      tokens += c.n;
      ASSERT_TRUE(bed.cache.can_append(c.id, c.n))
          << "step " << history.size() << ": chunk of " << c.n << " for seq " << c.id << " needs "
          << bed.cache.blocks_to_append(c.id, c.n) << " blocks, " << bed.pool.n_free() << " free";
      bed.cache.append(c.id, c.n);
      q.n_cached += c.n;
      if (q.n_cached == q.n_tokens()) ++q.generated;  // the chunk ended the known tokens: one is sampled
    }
    ASSERT_LE(tokens, lim.max_batch_tokens);
    for (SeqId id : std::vector<SeqId>(running)) {
      const SimSeq& q = seqs.at(id);
      if (q.generated == q.max_new) {
        std::erase(running, id);
        finished.push_back(id);
        releasing.push_back(id);
      }
    }
    // Progress: with work to do, a step that schedules nothing and ends nobody would repeat forever.
    if (!run.empty() || !wait.empty()) {
      ASSERT_FALSE(s.chunks.empty() && s.unservable.empty() && s.preempted.empty())
          << "step " << history.size() << " did nothing with " << run.size() << " running and " << wait.size()
          << " waiting (" << bed.pool.n_free() << " of " << bed.pool.n_total() << " blocks free)";
    }
  }
};

TEST(Scheduler, PrefillIsChunkedByMaxBatchTokens) {
  Bed bed(100);
  Sim sim{bed, limits(16, 32)};
  sim.arrive(7, 100, 3);
  Chunks got;
  while (!sim.idle()) {
    sim.step();
    if (::testing::Test::HasFatalFailure()) return;
    for (const ScheduledChunk& c : sim.history.back().chunks) got.emplace_back(c.id, c.start, c.n);
    ASSERT_LT(sim.history.size(), 20u);
  }
  sim.drain();
  EXPECT_EQ(got, (Chunks{{7, 0, 32}, {7, 32, 32}, {7, 64, 32}, {7, 96, 4}, {7, 100, 1}, {7, 101, 1}}));
  EXPECT_EQ(sim.history[0].admitted, (Ids{7}));
  EXPECT_EQ(bed.pool.n_free(), 100);
}

TEST(Scheduler, AdmitsInArrivalOrderWithoutSkipping) {
  Bed bed(20);
  // 40 tokens = 10 blocks fit; 80 tokens = 20 blocks do not fit beside them; the small one behind must wait.
  const std::deque<SchedulerSequence> waiting = {{1, 40, 0}, {2, 80, 0}, {3, 4, 0}};
  const Schedule s = schedule_step({}, waiting, kNone, bed.kv(), limits(16, 1000));
  EXPECT_EQ(s.admitted, (Ids{1}));
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 0, 40}}));

  const std::deque<SchedulerSequence> fits = {{5, 3, 0}, {4, 9, 0}, {6, 1, 0}};
  const Schedule t = schedule_step({}, fits, kNone, bed.kv(), limits(16, 1000));
  EXPECT_EQ(t.admitted, (Ids{5, 4, 6}));
  EXPECT_EQ(chunks_of(t), (Chunks{{5, 0, 3}, {4, 0, 9}, {6, 0, 1}}));
}

// Prefix caching: a sequence that starts after 32 cached tokens prefills only the rest; when it copies them (its
// policy may rewrite entries), the copies' 8 blocks must fit as well, and count against the sequences behind it.
TEST(Scheduler, CachedPrefixesShortenThePrefillAndCopiesTakeBlocks) {
  Bed bed(12);
  const Schedule shared = schedule_step({}, {{1, 40, 32, 0}}, kNone, bed.kv(), limits(16, 1000));
  EXPECT_EQ(chunks_of(shared), (Chunks{{1, 32, 8}}));
  const Schedule copied = schedule_step({}, {{1, 40, 32, 32}, {2, 8, 0, 0}}, kNone, bed.kv(), limits(16, 1000));
  EXPECT_EQ(copied.admitted, (Ids{1, 2}));  // 8 + 2 + 2 blocks of 12
  EXPECT_EQ(chunks_of(copied), (Chunks{{1, 32, 8}, {2, 0, 8}}));
  const Schedule full = schedule_step({}, {{1, 40, 32, 32}, {2, 12, 0, 0}}, kNone, bed.kv(), limits(16, 1000));
  EXPECT_EQ(full.admitted, (Ids{1})) << "the second does not fit beside the copies";
  Bed small(9);
  const Schedule none = schedule_step({}, {{1, 40, 32, 32}}, kNone, small.kv(), limits(16, 1000));
  EXPECT_TRUE(none.admitted.empty()) << "8 copied blocks and 2 for the rest do not fit in 9";
}

TEST(Scheduler, AdmissionStopsWhenTheBudgetIsSpent) {
  Bed bed(100);
  const std::deque<SchedulerSequence> waiting = {{1, 10, 0}, {2, 10, 0}, {3, 10, 0}};
  const Schedule s = schedule_step({}, waiting, kNone, bed.kv(), limits(16, 15));
  EXPECT_EQ(s.admitted, (Ids{1, 2}));
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 0, 10}, {2, 0, 5}}));
}

TEST(Scheduler, MaxRunningIsRespected) {
  Bed bed(100);
  const std::vector<SchedulerSequence> running = {bed.running(1, 5, 4), bed.running(2, 9, 8)};
  const std::deque<SchedulerSequence> waiting = {{3, 4, 0}, {4, 4, 0}, {5, 4, 0}};
  EXPECT_EQ(schedule_step(running, waiting, kNone, bed.kv(), limits(3, 100)).admitted, (Ids{3}));
  EXPECT_TRUE(schedule_step(running, waiting, kNone, bed.kv(), limits(2, 100)).admitted.empty());
  EXPECT_EQ(schedule_step(running, waiting, kNone, bed.kv(), limits(5, 100)).admitted, (Ids{3, 4, 5}));
  EXPECT_EQ(schedule_step({}, waiting, kNone, bed.kv(), limits(1, 100)).admitted, (Ids{3}));
}

TEST(Scheduler, WatermarkIsKeptFreeAtAdmission) {
  Bed bed(100);
  // One decoding sequence holding 10 blocks; its decode takes an 11th. 89 blocks stay free; the watermark is 10.
  const std::vector<SchedulerSequence> running = {bed.running(1, 41, 40)};
  {
    const std::deque<SchedulerSequence> waiting = {{2, 79 * kBlockSize, 0}};  // 79 + 10 <= 89
    const Schedule s = schedule_step(running, waiting, kNone, bed.kv(), limits(16, 1000, 0.1));
    EXPECT_EQ(s.admitted, (Ids{2}));
  }
  {
    const std::deque<SchedulerSequence> waiting = {{2, 79 * kBlockSize + 1, 0}};  // 80 + 10 > 89
    const Schedule s = schedule_step(running, waiting, kNone, bed.kv(), limits(16, 1000, 0.1));
    EXPECT_TRUE(s.admitted.empty());
    EXPECT_EQ(chunks_of(s), (Chunks{{1, 40, 1}}));
  }
  {
    // Without a watermark the same prompt fits.
    const std::deque<SchedulerSequence> waiting = {{2, 79 * kBlockSize + 1, 0}};
    EXPECT_EQ(schedule_step(running, waiting, kNone, bed.kv(), limits(16, 1000, 0.0)).admitted, (Ids{2}));
  }
  {
    // The watermark is rounded up to whole blocks: 0.001 of 100 blocks keeps 1 block.
    const std::deque<SchedulerSequence> waiting = {{2, 88 * kBlockSize + 1, 0}};  // 89 + 1 > 89
    EXPECT_TRUE(schedule_step(running, waiting, kNone, bed.kv(), limits(16, 1000, 0.001)).admitted.empty());
  }
}

TEST(Scheduler, DecodeShortagePreemptsTheNewestAndAdmitsNobody) {
  Bed bed(4);
  // Every sequence sits at a block boundary, so each decode needs a new block; the pool is full.
  const std::vector<SchedulerSequence> running = {bed.running(1, 9, 8), bed.running(2, 5, 4), bed.running(3, 5, 4)};
  ASSERT_EQ(bed.pool.n_free(), 0);
  const std::deque<SchedulerSequence> waiting = {{9, 1, 0}};
  const Schedule s = schedule_step(running, waiting, kNone, bed.kv(), limits(16, 100));
  EXPECT_EQ(s.preempted, (Ids{3, 2}));  // newest first, until the rest fit
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 8, 1}}));
  EXPECT_TRUE(s.admitted.empty());
  EXPECT_TRUE(s.unservable.empty());
}

TEST(Scheduler, DecodeShortageTakesOnlyAsManyAsNeeded) {
  Bed bed(7);
  const std::vector<SchedulerSequence> running = {bed.running(1, 9, 8), bed.running(2, 5, 4), bed.running(3, 6, 5),
                                                  bed.running(4, 5, 4)};
  ASSERT_EQ(bed.pool.n_free(), 1);
  // Sequences 1, 2 and 4 need a block each (3 > 1): preempting 4 gives 1 back, and 2 <= 2 then.
  const Schedule s = schedule_step(running, {}, kNone, bed.kv(), limits(16, 100));
  EXPECT_EQ(s.preempted, (Ids{4}));
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 8, 1}, {2, 4, 1}, {3, 5, 1}}));
}

TEST(Scheduler, SequenceAloneThatCannotGrowIsUnservable) {
  {
    Bed bed(2);
    const std::vector<SchedulerSequence> running = {bed.running(1, 9, 8)};  // decoding, pool full
    const Schedule s = schedule_step(running, {}, kNone, bed.kv(), limits(16, 100));
    EXPECT_EQ(s.unservable, (Ids{1}));
    EXPECT_TRUE(s.chunks.empty());
    EXPECT_TRUE(s.preempted.empty());
  }
  {
    Bed bed(3);
    const std::vector<SchedulerSequence> running = {bed.running(1, 20, 8)};  // its next chunk needs 3 more blocks
    const Schedule s = schedule_step(running, {}, kNone, bed.kv(), limits(16, 100));
    EXPECT_EQ(s.unservable, (Ids{1}));
    EXPECT_TRUE(s.chunks.empty());
    EXPECT_TRUE(s.preempted.empty());
  }
}

TEST(Scheduler, PromptChunkThatDoesNotFitPreemptsTheNewestOther) {
  Bed bed(10);
  const std::vector<SchedulerSequence> running = {
      bed.running(1, 5, 4),    // decoding, 1 block, needs a 2nd
      bed.running(2, 40, 8),   // prefilling, 2 blocks
      bed.running(3, 13, 12),  // decoding (newest), 3 blocks, needs a 4th
  };
  ASSERT_EQ(bed.pool.n_free(), 4);
  // Decodes take 2 blocks and 2 tokens; the chunk of 22 tokens (entries 8..29) needs 6 more blocks and 2 are
  // left: the newest other sequence (3) goes, giving back its 3 blocks and the block of its decode, which is
  // exactly enough; the oldest keeps its decode.
  const Schedule s = schedule_step(running, {{9, 1, 0}}, kNone, bed.kv(), limits(16, 24));
  EXPECT_EQ(s.preempted, (Ids{3}));
  EXPECT_EQ(chunks_of(s), (Chunks{{1, 4, 1}, {2, 8, 22}}));
  EXPECT_TRUE(s.admitted.empty());
  EXPECT_TRUE(s.unservable.empty());
}

TEST(Scheduler, BlocksOfFinishedSequencesReleasedInTheStepCountAsFree) {
  Bed bed(4);
  bed.cache.append(1, 16);  // finished: holds the whole pool until the step releases it
  const std::vector<SeqId> releasing = {1};
  const std::deque<SchedulerSequence> waiting = {{2, 8, 0}};
  EXPECT_TRUE(schedule_step({}, waiting, kNone, bed.kv(), limits(16, 100)).admitted.empty());
  const Schedule s = schedule_step({}, waiting, releasing, bed.kv(), limits(16, 100));
  EXPECT_EQ(s.admitted, (Ids{2}));
  EXPECT_EQ(chunks_of(s), (Chunks{{2, 0, 8}}));
}

TEST(Scheduler, SequenceAloneBesideAFinishedOneIsNotUnservable) {
  Bed bed(4);
  bed.cache.append(1, 8);  // finished, 2 blocks
  const std::vector<SchedulerSequence> running = {bed.running(2, 9, 8)};  // decoding, needs a 3rd block; pool full
  ASSERT_EQ(bed.pool.n_free(), 0);
  EXPECT_EQ(schedule_step(running, {}, kNone, bed.kv(), limits(16, 100)).unservable, (Ids{2}));
  const std::vector<SeqId> releasing = {1};
  const Schedule s = schedule_step(running, {}, releasing, bed.kv(), limits(16, 100));
  EXPECT_TRUE(s.unservable.empty());
  EXPECT_EQ(chunks_of(s), (Chunks{{2, 8, 1}}));
}

TEST(Scheduler, BlocksOfOneStepNeverExceedTheFreeBlocks) {
  // Apply the schedule of each scenario above to the cache and check that every chunk could be appended.
  struct Scenario {
    int64_t blocks;
    int layers;
    std::vector<std::tuple<SeqId, int, int>> running;  // id, n_tokens, n_cached
    std::deque<SchedulerSequence> waiting;
    SchedulerLimits lim;
  };
  const std::vector<Scenario> scenarios = {
      {4, 1, {{1, 9, 8}, {2, 5, 4}, {3, 5, 4}}, {{9, 1, 0}}, limits(16, 100)},
      {10, 1, {{1, 5, 4}, {2, 40, 8}, {3, 13, 12}}, {{9, 1, 0}}, limits(16, 20)},
      {12, 2, {{1, 5, 4}, {2, 40, 8}, {3, 13, 12}}, {{9, 1, 0}}, limits(16, 20)},
      {30, 3, {{1, 17, 16}, {2, 9, 3}}, {{4, 7, 0}, {5, 2, 0}}, limits(16, 64)},
      {8, 2, {{1, 2, 1}, {2, 2, 1}, {3, 2, 1}}, {{4, 3, 0}}, limits(16, 64)},
  };
  for (size_t i = 0; i < scenarios.size(); ++i) {
    SCOPED_TRACE("scenario " + std::to_string(i));
    const Scenario& sc = scenarios[i];
    Bed bed(sc.blocks, sc.layers);
    Sim sim{bed, sc.lim};
    for (const auto& [id, n_tokens, n_cached] : sc.running) {
      sim.seqs[id] = SimSeq{id, n_tokens, 1000, 0, n_cached};
      bed.cache.append(id, n_cached);
      sim.running.push_back(id);
    }
    for (const SchedulerSequence& w : sc.waiting) sim.arrive(w.id, w.n_tokens, 1000);
    for (int step = 0; step < 5 && !::testing::Test::HasFatalFailure(); ++step) sim.step();
  }
}

struct Workload {
  uint32_t seed;
  int64_t blocks;
  int layers;
  SchedulerLimits lim;
  int n_seqs;
  int max_prompt;
  int max_new;
};

// Returns the number of preemptions.
int64_t run_workload(const Workload& w) {
  Bed bed(w.blocks, w.layers);
  Sim sim{bed, w.lim};
  std::mt19937 rng(w.seed);
  int next_id = 1;
  for (int step = 0; step < 20000; ++step) {
    // Requests arrive over the first steps, a few at a time.
    if (next_id <= w.n_seqs && rng() % 2 == 0) {
      const int n = 1 + int(rng() % 3);
      for (int i = 0; i < n && next_id <= w.n_seqs; ++i) {
        sim.arrive(next_id++, 1 + int(rng() % uint32_t(w.max_prompt)), 1 + int(rng() % uint32_t(w.max_new)));
      }
    }
    if (sim.idle() && next_id > w.n_seqs) break;
    if (sim.idle()) continue;
    sim.step();
    if (::testing::Test::HasFatalFailure()) return sim.n_preemptions;
  }
  EXPECT_TRUE(sim.idle()) << sim.running.size() << " running and " << sim.waiting.size() << " waiting at the end";
  sim.drain();
  EXPECT_EQ(int(sim.finished.size()), w.n_seqs);
  EXPECT_TRUE(sim.unservable.empty());
  for (SeqId id : sim.finished) EXPECT_EQ(sim.seqs[id].generated, sim.seqs[id].max_new) << id;
  EXPECT_EQ(bed.pool.n_free(), bed.pool.n_total());
  return sim.n_preemptions;
}

TEST(Scheduler, RandomWorkloadsKeepEveryPromise) {
  // Every sequence fits the pool alone with the watermark to spare (prompt + generated <= 40 tokens = 10 blocks a
  // layer, 20 in all, of 24), so all of them must finish; the pool is small enough that preemption happens.
  int64_t preemptions = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Workload w{seed, 24, 2, limits(4 + int(seed % 3), 8 + 4 * int(seed % 4), 0.05), 30, 30, 10};
    preemptions += run_workload(w);
    if (HasFatalFailure()) return;
  }
  // A variant with one layer, a bigger pool and long decodes.
  const int64_t long_preemptions = run_workload({99, 64, 1, limits(8, 48, 0.02), 40, 100, 120});
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(long_preemptions, 0);
}

TEST(Scheduler, RandomWorkloadsPreempt) {
  // The workloads above are meant to exercise preemption; make sure one of them does.
  Bed bed(24, 2);
  Sim sim{bed, limits(6, 16, 0.05)};
  for (int i = 1; i <= 6; ++i) sim.arrive(i, 6, 30);  // short prompts, long decodes: the pool runs out
  for (int step = 0; step < 2000 && !sim.idle(); ++step) {
    sim.step();
    if (HasFatalFailure()) return;
  }
  EXPECT_TRUE(sim.idle());
  sim.drain();
  EXPECT_GT(sim.n_preemptions, 0);
  EXPECT_EQ(sim.finished.size(), 6u);
  EXPECT_EQ(bed.pool.n_free(), 24);
}

// With nothing running and an empty pool, the head of the queue fits the pool (the engine accepts a prompt
// when it fits the whole pool: Engine::submit) but not the pool minus the watermark. It must be admitted (the
// watermark protects running decodes, and there are none) or reported; leaving it waiting stalls the queue
// forever, since admission never skips it.
TEST(Scheduler, PromptThatFitsTheEmptyPoolOnlyWithoutTheWatermarkIsNotStuck) {
  Bed bed(100);
  const std::deque<SchedulerSequence> waiting = {{1, 399, 0}, {2, 5, 0}};  // 100 blocks; the watermark is 1
  const Schedule s = schedule_step({}, waiting, kNone, bed.kv(), limits(16, 512, 0.01));
  const bool admitted = std::find(s.admitted.begin(), s.admitted.end(), 1) != s.admitted.end();
  const bool reported = std::find(s.unservable.begin(), s.unservable.end(), 1) != s.unservable.end();
  EXPECT_TRUE(admitted || reported) << "sequence 1 is neither admitted nor reported: the queue is stuck";
}

// The same stall reached through preemption: a sequence that grew while running is preempted and comes back to
// the queue needing more blocks than the pool minus the watermark. Pool of 10 blocks, watermark 2 blocks:
// sequence 2 (prompt 28 = 7 blocks) is admitted beside sequence 1, grows to 32 entries (8 blocks) while sequence 1
// takes the last free block, and is preempted needing 9 blocks; 9 + 2 > 10, so once sequence 1 has finished it is
// alone in the queue, never admitted and never reported. (It can never finish - 128 tokens do not fit the pool -
// so the expected end is "unservable", after running alone.)
TEST(Scheduler, PreemptedSequenceThatGrewIsNotStuckForever) {
  Bed bed(10);
  Sim sim{bed, limits(4, 64, 0.2)};
  sim.arrive(1, 1, 10);
  sim.arrive(2, 28, 100);
  for (int step = 0; step < 200 && !sim.idle(); ++step) {
    sim.step();
    if (HasFatalFailure()) return;
  }
  EXPECT_TRUE(sim.idle()) << sim.waiting.size() << " waiting";
  EXPECT_GT(sim.n_preemptions, 0);
  EXPECT_EQ(sim.finished, (Ids{1}));
}

// Pipeline parallelism: each stage has its own pool and its own layers; a chunk is admitted only when it fits in
// every stage. Stage 0 (2 layers, 40 blocks) is nearly empty; stage 1 (1 layer, 12 blocks) holds sequence 1.
TEST(Scheduler, EveryPipelineStageMustHoldTheChunk) {
  Bed stage0(40, 2), stage1(12, 1);
  stage0.cache.append(1, 20);  // 5 blocks in each of 2 layers: 30 free
  stage1.cache.append(1, 20);  // 5 blocks: 7 free
  const std::vector<SchedulerSequence> running = {{1, 21, 20}};
  const std::vector<SeqId> ids = {1, 2};
  const PipelineKv kv({kv_report(stage0.cache, ids), kv_report(stage1.cache, ids)});
  ASSERT_EQ(kv.blocks_to_append(0, 1, 1), 2);  // a new block in each layer of stage 0
  ASSERT_EQ(kv.blocks_to_append(1, 1, 1), 1);
  ASSERT_EQ(kv.blocks_held(0, 1), 10);
  // 24 tokens: 12 blocks on stage 0 (room for 28 after the decode), 6 on stage 1 (room for 6): fits.
  {
    const std::deque<SchedulerSequence> waiting = {{2, 24, 0}};
    EXPECT_EQ(schedule_step(running, waiting, kNone, kv, limits(16, 100)).admitted, (Ids{2}));
  }
  // 25 tokens: 7 blocks on stage 1, one more than it has left after the decode; stage 0 alone would take it.
  {
    const std::deque<SchedulerSequence> waiting = {{2, 25, 0}};
    const Schedule s = schedule_step(running, waiting, kNone, kv, limits(16, 100));
    EXPECT_TRUE(s.admitted.empty());
    EXPECT_EQ(chunks_of(s), (Chunks{{1, 20, 1}}));
  }
  // Sequence 1 finishing frees its blocks on both stages in the same step: now it fits.
  {
    const std::deque<SchedulerSequence> waiting = {{2, 25, 0}};
    const std::vector<SeqId> releasing = {1};
    EXPECT_EQ(schedule_step({}, waiting, releasing, kv, limits(16, 100)).admitted, (Ids{2}));
  }
}

// Chunked prefill compression: a waiting sequence is admitted by its peak (entries per global layer), not by its
// whole prompt, and every prompt chunk ends at the next multiple of prefill_chunk, where the ranks compress.
TEST(Scheduler, ChunkedPrefillAdmitsByThePeakAndCutsChunksAtCompressionPoints) {
  Bed bed(40, /*n_layers=*/2);  // 40 blocks of 4: 80 entries a layer
  SchedulerLimits l = limits(16, 100);
  l.prefill_chunk = 8;
  // A 200-token prompt (50 blocks a layer, more than the whole pool) whose layers hold at most 12 + 8 entries.
  const std::vector<int> peak = {20, 20};
  {
    const std::deque<SchedulerSequence> waiting = {{1, 200, 0, 0, peak}};
    const Schedule s = schedule_step({}, waiting, kNone, bed.kv(), l);
    EXPECT_EQ(s.admitted, (Ids{1}));
    EXPECT_EQ(chunks_of(s), (Chunks{{1, 0, 8}})) << "the first chunk ends at the first compression point";
  }
  // Without the peak the same prompt waits (it would be refused at submit).
  {
    const std::deque<SchedulerSequence> waiting = {{1, 200, 0}};
    EXPECT_TRUE(schedule_step({}, waiting, kNone, bed.kv(), l).admitted.empty());
  }
  // A running prefill at position 13 takes 3 tokens to reach 16, the next point, however large the budget.
  {
    const std::vector<SchedulerSequence> running = {bed.running(2, 200, 13)};
    EXPECT_EQ(chunks_of(schedule_step(running, {}, kNone, bed.kv(), l)), (Chunks{{2, 13, 3}}));
  }
  // The peak is counted in blocks per layer, on what is free: sequence 2's 13 entries take 4 blocks in each
  // layer, 32 are left. A peak of 64 entries a layer (16 blocks, 32 in all) fits; 65 (17 blocks) does not.
  {
    const std::vector<SchedulerSequence> running = {{2, 200, 13}};
    const std::vector<int> fits = {64, 64}, too_big = {65, 64};
    const std::deque<SchedulerSequence> a = {{3, 1000, 0, 0, fits}};
    const std::deque<SchedulerSequence> b = {{3, 1000, 0, 0, too_big}};
    EXPECT_EQ(schedule_step(running, a, kNone, bed.kv(), l).admitted, (Ids{3}));
    EXPECT_TRUE(schedule_step(running, b, kNone, bed.kv(), l).admitted.empty());
  }
}

// The chunk that ends at a compression point before the prompt's end carries the scoring rows: its blocks and the
// step's token budget count them; the chunk that ends the prompt carries none.
TEST(Scheduler, AChunkEndingAtACompressionPointCarriesTheScoringRows) {
  Bed bed(40, /*n_layers=*/2);  // 40 blocks of 4: 80 entries a layer
  SchedulerLimits l = limits(16, 100);
  l.prefill_chunk = 8;
  SchedulerSequence s = bed.running(1, 30, 16);
  s.n_scoring = 4;
  const Schedule at_point = schedule_step({s}, {}, kNone, bed.kv(), l);
  ASSERT_EQ(at_point.chunks.size(), 1u);
  EXPECT_EQ(at_point.chunks[0].n, 8);
  EXPECT_EQ(at_point.chunks[0].n_scoring, 4);
  s = bed.running(2, 30, 24);
  s.n_scoring = 4;
  const Schedule last = schedule_step({s}, {}, kNone, bed.kv(), l);
  ASSERT_EQ(last.chunks.size(), 1u);
  EXPECT_EQ(last.chunks[0].n, 6);
  EXPECT_EQ(last.chunks[0].n_scoring, 0) << "the prompt's end is scored by its own last rows";
  // 16 entries held (4 blocks a layer, 8 in all) and 32 free: 8 + 4 entries take 3 blocks a layer. With 5 blocks
  // left the chunk does not fit, though its 8 tokens alone would (2 blocks a layer).
  Bed tight(13, /*n_layers=*/2);
  s = tight.running(1, 30, 16);
  s.n_scoring = 4;
  EXPECT_EQ(tight.kv().n_free(0), 5);
  const Schedule stalled = schedule_step({s}, {}, kNone, tight.kv(), l);
  EXPECT_TRUE(stalled.chunks.empty());
  EXPECT_EQ(stalled.unservable, (Ids{1})) << "alone in the pool and still too big";
}

}  // namespace
}  // namespace strata
