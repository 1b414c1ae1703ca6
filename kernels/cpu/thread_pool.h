#pragma once
// The compute threads of the CPU backend: one persistent pool that every CPU op runs its loops on.
//
// Why not OpenMP: an op is a fork-join over a few microseconds of work, 300 of them per decoded token. With
// OpenMP's static schedules and barriers, a thread whose core another process holds stalls every op until the
// scheduler gives it the core back (decoding up to 20x slower on a busy machine, bench/results/README.md). Here:
//   - work is cut into chunks that threads claim one at a time, so a thread that is not running claims nothing
//     and the others (the caller included) take its share. Each thread first claims from its own contiguous share
//     of the chunks (a counter on its own cache line), then from the others': a claim costs a cache hit, not a
//     cache line passed between cores, which at 3,000 chunks a decode step took about a quarter of SmolLM2's
//     batch-1 decode speed (docs/decisions.md, [cpu-xeon]);
//   - a waiting thread spins for a bounded time (kSpin below), then yields, then sleeps on a futex, so idle
//     compute threads leave the cores to whoever needs them, and a blocked caller lets the scheduler move a
//     descheduled worker onto its core.
// The caller of parallel_for works too: a pool of n threads starts n - 1 of its own.
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

namespace strata::cpu {

class ThreadPool {
 public:
  // n_threads >= 1 counts the caller: n_threads - 1 threads are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) in chunks of at most `grain` items, on the pool's threads and the caller's,
  // and returns when every chunk is done. Chunks may run in any order and on any thread. A call from inside a
  // chunk (a nested loop) runs serially on that thread. The first exception a chunk throws is rethrown here once
  // every chunk has ended.
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); }, &fn);
  }

  // A hint: the next job reads these bytes (the first kMaxReadAheadRanges ranges, in order, as one run). Each of
  // the pool's own threads that is waiting for work (spinning or yielding, not asleep) reads the part of them its
  // own share of an even split would claim into its L2 cache (up to half of it), until the next job begins; the
  // caller goes on at once. What a decode step does between two weight products (norms, rounding, adds) leaves the
  // memory idle otherwise (docs/decisions.md, [cpu-xeon]).
  struct ByteRange {
    const uint8_t* data = nullptr;
    int64_t bytes = 0;
  };
  static constexpr size_t kMaxReadAheadRanges = 4;
  void read_ahead(std::span<const ByteRange> ranges);

  // The index of the calling thread within the pool that runs it: 0 for a caller, 1..size()-1 for the pool's
  // own threads. Ops that keep per-thread scratch index it with this (size() entries).
  static int thread_index();

 private:
  using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, int64_t grain, ChunkFn fn, void* ctx);
  void worker_loop(int index);
  // Claims and runs chunks of the job of generation `gen` until none is left.
  void work_on(uint32_t gen);

  // One thread's share of the current job's chunks. `cursor` packs the job's generation (high 32 bits) and the
  // share's next unclaimed chunk (low 32): a thread claims chunk c of generation g by moving it from (g, c) to
  // (g, c + 1), so a thread that wakes late with an old generation can never take a chunk of a newer job.
  struct alignas(64) Share {
    std::atomic<uint64_t> cursor{0};
    std::atomic<int64_t> end{0};  // one past the share's last chunk
  };
  // Claims and runs chunks of `share` until it has none left or the job is over; returns how many it ran, or -1
  // once the share belongs to another generation.
  int64_t drain(Share& share, uint32_t gen);

  std::vector<std::thread> workers_;
  std::vector<Share> shares_;  // one per thread, the caller's first
  std::mutex submit_;  // one job at a time

  // The current job.
  std::atomic<uint32_t> generation_{0};  // what sleeping threads wait on
  alignas(64) std::atomic<int32_t> chunks_done_{0};
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, grain_ = 0;
  std::atomic<int64_t> n_chunks_{0};
  std::atomic<bool> stop_{false};
  std::mutex failure_mutex_;
  std::exception_ptr failure_;

  // The ranges of the latest read_ahead, which a waiting thread reads while the caller may be writing newer ones:
  // each field atomic (a thread that reads a torn set only prefetches other bytes; prefetches never fault).
  void read_ahead_share(int index, uint32_t gen);
  std::atomic<uint32_t> read_ahead_seq_{0};
  std::atomic<const uint8_t*> read_ahead_data_[kMaxReadAheadRanges] = {};
  std::atomic<int64_t> read_ahead_bytes_[kMaxReadAheadRanges] = {};
};

// The process-wide pool of the CPU backend's ops. Its size is engine.threads (set_compute_threads; 0 or never set:
// every core the process may run on).
ThreadPool& compute_pool();
// Replaces the pool with one of n threads (n <= 0: every core). Not while an op runs.
void set_compute_threads(int n);

template <class F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  compute_pool().parallel_for(n, grain, std::forward<F>(fn));
}

}  // namespace strata::cpu
