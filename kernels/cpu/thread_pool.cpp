#include "kernels/cpu/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_CPU_RELAX() _mm_pause()
#define STRATA_PREFETCH_L2(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1)
#else
#define STRATA_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#define STRATA_PREFETCH_L2(p) __builtin_prefetch(p, 0, 2)
#endif

namespace strata::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// How long a waiting thread spins before it yields, and yields before it sleeps. An op takes microseconds and the
// gap between two ops of a step is shorter still, so a step's threads stay awake through the step; between steps
// (the engine's own work, an idle server) they soon leave the cores. Under a competing process the yields let it
// run on the core instead of this thread's spinning.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kYield = std::chrono::microseconds(200);

constexpr int64_t kCacheLine = 64;

// What one thread reads ahead at most: half its L2 cache, so that what it read first is still there when the job
// needs it (512 KiB where the system does not say).
const int64_t kReadAheadBytes = [] {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? int64_t(l2) / 2 : int64_t{1} << 19;
}();

constexpr uint64_t kClosed = 0xFFFFFFFFu;  // a chunk index past every job's last: claims nothing

thread_local int tls_thread_index = 0;
thread_local bool tls_in_chunk = false;

// Waits until ready() holds: spins, then yields, then sleeps on `word` (an atomic that changes, and is notified,
// whenever ready() may have become true).
template <class Word, class Ready>
void wait_until(std::atomic<Word>& word, Ready ready) {
  const Clock::time_point start = Clock::now();
  for (int i = 1;; ++i) {
    const Word seen = word.load(std::memory_order_acquire);
    if (ready()) return;
    if (i % 32 != 0) {
      STRATA_CPU_RELAX();
      continue;
    }
    const auto waited = Clock::now() - start;
    if (waited < kSpin) continue;
    if (waited < kYield) {
      sched_yield();
      continue;
    }
    word.wait(seen, std::memory_order_acquire);
  }
}

int cores_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

// The pool is made once and replaced only between ops (set_compute_threads), so every op finds it with one atomic
// load (`current_pool`) rather than a mutex: some 150 ops a decode step look it up, several times each.
std::mutex global_pool_mutex;
std::unique_ptr<ThreadPool> global_pool;
std::atomic<ThreadPool*> current_pool{nullptr};

}  // namespace

ThreadPool::ThreadPool(int n_threads) : shares_(size_t(std::max(1, n_threads))) {
  for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::thread_index() { return tls_thread_index; }

void ThreadPool::run(int64_t n, int64_t grain, ChunkFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  if (n_chunks == 1 || workers_.empty() || tls_in_chunk) {
    for (int64_t b = 0; b < n; b += grain) fn(ctx, b, std::min(n, b + grain));
    return;
  }
  std::lock_guard<std::mutex> lock(submit_);
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  // Close the old job's claims before its fields change: a thread that read the old job's last claim could
  // otherwise pair it with the new job's share ends, claim a chunk past the old job's end, and run (and count) a
  // chunk of the new job twice. No claim of the new generation succeeds until its share opens below.
  for (Share& share : shares_) share.cursor.store(uint64_t{gen} << 32 | kClosed, std::memory_order_release);
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  n_chunks_.store(n_chunks, std::memory_order_relaxed);
  chunks_done_.store(0, std::memory_order_relaxed);
  const int64_t n_shares = int64_t(shares_.size());
  for (int64_t t = 0; t < n_shares; ++t) {
    shares_[size_t(t)].end.store(n_chunks * (t + 1) / n_shares, std::memory_order_relaxed);
    shares_[size_t(t)].cursor.store(uint64_t{gen} << 32 | uint64_t(n_chunks * t / n_shares),
                                    std::memory_order_release);
  }
  generation_.store(gen, std::memory_order_release);
  generation_.notify_all();

  work_on(gen);
  wait_until(chunks_done_, [&] { return chunks_done_.load(std::memory_order_acquire) == n_chunks; });
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

int64_t ThreadPool::drain(Share& share, uint32_t gen) {
  int64_t ran = 0;
  for (;;) {
    uint64_t c = share.cursor.load(std::memory_order_acquire);
    if (uint32_t(c >> 32) != gen) return -1;
    const int64_t chunk = int64_t(c & 0xFFFFFFFFu);
    // end may already belong to a newer job; then the cursor has changed too and the exchange fails.
    if (chunk >= share.end.load(std::memory_order_relaxed)) return ran;
    if (!share.cursor.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
    // The job cannot end before this chunk is counted, so its fields stay as they are until then.
    const int64_t begin = chunk * grain_;
    try {
      fn_(ctx_, begin, std::min(n_, begin + grain_));
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
    ++ran;
  }
}

void ThreadPool::work_on(uint32_t gen) {
  tls_in_chunk = true;
  // The thread's own share first, then the others' in turn; the chunks it ran are counted once, at the end (the
  // job cannot end, nor another begin, until they are).
  const size_t n_shares = shares_.size(), own = size_t(tls_thread_index) % n_shares;
  int64_t ran = 0;
  for (size_t k = 0; k < n_shares; ++k) {
    const int64_t r = drain(shares_[(own + k) % n_shares], gen);
    if (r < 0) break;
    ran += r;
  }
  if (ran > 0) {
    const int64_t n_chunks = n_chunks_.load(std::memory_order_relaxed);
    if (chunks_done_.fetch_add(int32_t(ran), std::memory_order_acq_rel) + ran == n_chunks) chunks_done_.notify_one();
  }
  tls_in_chunk = false;
}

void ThreadPool::read_ahead(std::span<const ByteRange> ranges) {
  if (workers_.empty()) return;
  for (size_t i = 0; i < kMaxReadAheadRanges; ++i) {
    const ByteRange r = i < ranges.size() ? ranges[i] : ByteRange{};
    read_ahead_data_[i].store(r.data, std::memory_order_relaxed);
    read_ahead_bytes_[i].store(r.bytes, std::memory_order_relaxed);
  }
  read_ahead_seq_.fetch_add(1, std::memory_order_release);
}

// Not inlined into worker_loop, so that a profile tells reading ahead from waiting (bench/decode_profile.py).
[[gnu::noinline]] void ThreadPool::read_ahead_share(int index, uint32_t gen) {
  const uint8_t* data[kMaxReadAheadRanges];
  int64_t bytes[kMaxReadAheadRanges], total = 0;
  for (size_t i = 0; i < kMaxReadAheadRanges; ++i) {
    data[i] = read_ahead_data_[i].load(std::memory_order_relaxed);
    bytes[i] = read_ahead_bytes_[i].load(std::memory_order_relaxed);
    total += bytes[i];
  }
  // [begin, end) of the ranges taken as one run, then of each range in turn; a look for the next job every 64 lines.
  const int64_t n = int64_t(shares_.size());
  int64_t begin = total * index / n;
  int64_t end = std::min(total * (index + 1) / n, begin + kReadAheadBytes);
  int64_t lines = 0;
  for (size_t i = 0; i < kMaxReadAheadRanges && end > 0; ++i) {
    for (int64_t at = std::max<int64_t>(0, begin); at < std::min(bytes[i], end); at += kCacheLine) {
      if (++lines % 64 == 0 && generation_.load(std::memory_order_relaxed) != gen) return;
      STRATA_PREFETCH_L2(data[i] + at);
    }
    begin -= bytes[i];
    end -= bytes[i];
  }
}

void ThreadPool::worker_loop(int index) {
  tls_thread_index = index;
  // From generation 0, the pool's first: a thread that starts late still sees every later job, and the stop of a
  // pool destroyed before this thread ran at all.
  uint32_t seen = 0, read_ahead_seen = 0;
  for (;;) {
    wait_until(generation_, [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen ||
             read_ahead_seq_.load(std::memory_order_acquire) != read_ahead_seen;
    });
    if (stop_.load(std::memory_order_acquire)) return;
    // A hint that a job overtook is dropped: the job may be the one it was for.
    const uint32_t gen = generation_.load(std::memory_order_acquire);
    read_ahead_seen = read_ahead_seq_.load(std::memory_order_acquire);
    if (gen == seen) {
      read_ahead_share(index, seen);
      continue;
    }
    seen = gen;
    work_on(seen);
  }
}

ThreadPool& compute_pool() {
  if (ThreadPool* pool = current_pool.load(std::memory_order_acquire)) return *pool;
  std::lock_guard<std::mutex> lock(global_pool_mutex);
  if (!global_pool) {
    global_pool = std::make_unique<ThreadPool>(cores_available());
    current_pool.store(global_pool.get(), std::memory_order_release);
  }
  return *global_pool;
}

void set_compute_threads(int n) {
  std::lock_guard<std::mutex> lock(global_pool_mutex);
  const int want = n > 0 ? n : cores_available();
  if (global_pool && global_pool->size() == want) return;
  current_pool.store(nullptr, std::memory_order_release);
  global_pool.reset();
  global_pool = std::make_unique<ThreadPool>(want);
  current_pool.store(global_pool.get(), std::memory_order_release);
}

}  // namespace strata::cpu
