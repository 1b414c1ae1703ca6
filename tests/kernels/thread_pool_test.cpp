// The CPU backend's compute threads (kernels/cpu/thread_pool.h): every index of a loop run exactly once, in chunks
// no larger than asked, with more threads than cores, exceptions, nested loops, jobs from two threads at once,
// many tiny jobs in a row (a lost wake-up or a stale job would hang or miscount here), jobs of alternating sizes
// (a stale claim), a thread held up in its first chunk (the others take the rest of its share), pools made and
// destroyed before their threads have run, and read-ahead hints between jobs (they change no job's work).
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <span>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace strata::cpu {
namespace {

// Runs [0, n) in chunks of `grain` and checks that every index was visited once and no chunk was too large.
void expect_each_index_once(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
  std::atomic<bool> oversized{false};
  pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    if (end - begin > grain || begin >= end) oversized = true;
    for (int64_t i = begin; i < end; ++i) visits[size_t(i)].fetch_add(1);
  });
  EXPECT_FALSE(oversized) << "n " << n << ", grain " << grain;
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[size_t(i)].load(), 1) << "index " << i << " of " << n;
}

TEST(ThreadPool, EveryIndexOnceForEverySizeAndGrain) {
  for (int threads : {1, 2, 3, 8}) {  // 8: more threads than this machine's cores
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 3, 16, 5000}) expect_each_index_once(pool, n, grain);
    }
  }
}

TEST(ThreadPool, ThreadIndexIsWithinThePool) {
  ThreadPool pool(3);
  std::atomic<bool> outside{false};
  pool.parallel_for(300, 1, [&](int64_t, int64_t) {
    const int index = ThreadPool::thread_index();
    if (index < 0 || index >= pool.size()) outside = true;
  });
  EXPECT_FALSE(outside);
  EXPECT_EQ(ThreadPool::thread_index(), 0);  // the caller
}

TEST(ThreadPool, AnExceptionIsRethrownAfterEveryChunkEnded) {
  ThreadPool pool(3);
  std::atomic<int> chunks{0};
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [&](int64_t begin, int64_t) {
                                   chunks.fetch_add(1);
                                   if (begin == 37) throw std::runtime_error("chunk 37");
                                 }),
               std::runtime_error);
  EXPECT_EQ(chunks.load(), 100);  // the other chunks still ran, and none is running now
  expect_each_index_once(pool, 500, 7);  // the pool still works
}

TEST(ThreadPool, NestedLoopsRunSeriallyInsideAChunk) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> visits(40 * 30);
  pool.parallel_for(40, 1, [&](int64_t outer, int64_t) {
    pool.parallel_for(30, 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) visits[size_t(outer * 30 + i)].fetch_add(1);
    });
  });
  for (const auto& v : visits) ASSERT_EQ(v.load(), 1);
}

TEST(ThreadPool, TwoSubmittingThreadsBothGetTheirResults) {
  ThreadPool pool(3);
  auto submit = [&](int64_t n, int64_t& total) {
    for (int round = 0; round < 200; ++round) {
      std::atomic<int64_t> sum{0};
      pool.parallel_for(n, 5, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) sum.fetch_add(i);
      });
      total += sum.load();
    }
  };
  int64_t a = 0, b = 0;
  std::thread other([&] { submit(300, b); });
  submit(100, a);
  other.join();
  EXPECT_EQ(a, 200 * (100 * 99 / 2));
  EXPECT_EQ(b, 200 * (300 * 299 / 2));
}

TEST(ThreadPool, ManyTinyJobsInARow) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 100000; ++job) {
    pool.parallel_for(4, 1, [&](int64_t begin, int64_t) { sum.fetch_add(begin + 1); });
  }
  EXPECT_EQ(sum.load(), 100000 * (1 + 2 + 3 + 4));
}

// Jobs that alternate between a few chunks and more: a thread that read the small job's last claim once took a
// chunk of the next, larger job past that claim's index, so the chunk ran twice and the job's count overshot and
// never ended. A watchdog turns such a hang into a failure.
TEST(ThreadPool, AJobNeverRunsAChunkOfTheNextOne) {
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) {
      std::fprintf(stderr, "ThreadPool.AJobNeverRunsAChunkOfTheNextOne: the pool hung\n");
      std::_Exit(1);
    }
  });
  ThreadPool pool(4);  // more threads than this machine's cores: late threads are the point
  int64_t wrong = 0;
  for (int job = 0; job < 2000000; ++job) {
    const int64_t n = job % 2 == 0 ? 2 : 9;
    std::atomic<int64_t> sum{0};
    pool.parallel_for(n, 1, [&](int64_t begin, int64_t) {
      for (int spin = 0; spin < 50; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);  // a little work
      sum.fetch_add(begin + 1);
    });
    wrong += sum.load() != n * (n + 1) / 2 ? 1 : 0;
  }
  done = true;
  watchdog.join();
  EXPECT_EQ(wrong, 0) << "jobs with a chunk run twice or not at all";
}

// Each thread starts on its own share of the chunks; one held up in its first chunk (as if the scheduler had
// paused it) must leave the rest of its share to the others, or the job would wait for it chunk by chunk.
TEST(ThreadPool, AThreadHeldUpLeavesTheRestOfItsShareToTheOthers) {
  ThreadPool pool(2);
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::atomic<int> by_worker{0}, by_caller{0};
    std::atomic<bool> worker_held{false};
    pool.parallel_for(64, 1, [&](int64_t, int64_t) {
      if (ThreadPool::thread_index() == 0) {
        by_caller.fetch_add(1);
        return;
      }
      by_worker.fetch_add(1);
      if (!worker_held.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    });
    ASSERT_EQ(by_worker.load() + by_caller.load(), 64);
    // The worker's share is 32 chunks; held up in its first, it ran few of them (the first and any it had
    // claimed before the caller got there). A worker that never woke for this job leaves all 64 to the caller.
    if (by_worker.load() > 0) {
      EXPECT_GT(by_caller.load(), 32 + 16) << "the caller did not take the held-up thread's share";
    }
  }
}

// A pool destroyed right after its first job, or before any: its threads may not have started yet (the stop they
// must still see was once missed, and the destructor waited forever).
TEST(ThreadPool, PoolsMadeAndDestroyedAtOnce) {
  for (int round = 0; round < 200; ++round) {
    ThreadPool pool(1 + round % 4);
    if (round % 2 == 0) expect_each_index_once(pool, 50, 5);
  }
}

// read_ahead between jobs: hints of any size (more ranges than are taken, ranges larger than what a thread reads
// ahead), hints that no job follows for long (the threads asleep), a pool destroyed right after a hint. The jobs
// still run every index once and nothing hangs.
TEST(ThreadPool, ReadAheadHintsBetweenJobsChangeNothing) {
  std::vector<uint8_t> bytes(size_t(16) << 20, 1);
  std::vector<ThreadPool::ByteRange> ranges;
  for (int i = 0; i < 6; ++i) ranges.push_back({bytes.data() + i * 4096, int64_t(bytes.size()) / 8 - i * 4096});
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int job = 0; job < 3000; ++job) {
      pool.read_ahead(std::span(ranges).first(size_t(job % 7)));
      if (job % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // asleep when it comes
      expect_each_index_once(pool, 1 + job % 200, 1 + job % 13);
    }
  }
  for (int round = 0; round < 200; ++round) {
    ThreadPool pool(1 + round % 4);
    pool.read_ahead(ranges);
  }
}

TEST(ThreadPool, ComputeThreadsCanBeResized) {
  const int saved = compute_pool().size();
  for (int n : {1, 3, 2}) {
    set_compute_threads(n);
    EXPECT_EQ(compute_pool().size(), n);
    std::atomic<int> count{0};
    parallel_for(1000, 10, [&](int64_t begin, int64_t end) { count.fetch_add(int(end - begin)); });
    EXPECT_EQ(count.load(), 1000);
  }
  set_compute_threads(saved);
}

}  // namespace
}  // namespace strata::cpu
