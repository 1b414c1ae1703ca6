#include "leader/scheduler.h"

#include <algorithm>
#include <cmath>

namespace strata {
namespace {

// Blocks per pipeline stage: a chunk fits when it fits in every stage's pool.
using StageBlocks = std::vector<int64_t>;

// The state of one scheduling decision while it is being built.
class StepBuilder {
 public:
  StepBuilder(const std::vector<SchedulerSequence>& running, std::span<const SeqId> releasing, const PipelineKv& kv,
              int budget)
      : active_(running.begin(), running.end()), kv_(kv), free_(size_t(kv.n_stages())), budget_(budget) {
    for (int st = 0; st < kv.n_stages(); ++st) {
      free_[size_t(st)] = kv.n_free(st);
      for (SeqId id : releasing) free_[size_t(st)] += kv.blocks_held(st, id);
    }
  }

  Schedule& out() { return out_; }
  const std::vector<SchedulerSequence>& active() const { return active_; }
  int budget() const { return budget_; }

  // Appending n entries to seq, plus keep_free blocks on every stage, fits what is left.
  bool fits(SeqId id, int n, const StageBlocks& keep_free) const {
    for (int st = 0; st < kv_.n_stages(); ++st) {
      if (kv_.blocks_to_append(st, id, n) + keep_free[size_t(st)] > free_[size_t(st)]) return false;
    }
    return true;
  }
  bool fits(SeqId id, int n) const { return fits(id, n, StageBlocks(free_.size(), 0)); }
  // A new sequence's peak (entries per global layer), plus keep_free blocks on every stage, fits what is left.
  bool fits_peak(std::span<const int> peak, const StageBlocks& keep_free) const {
    for (int st = 0; st < kv_.n_stages(); ++st) {
      if (kv_.blocks_for_entries(st, peak) + keep_free[size_t(st)] > free_[size_t(st)]) return false;
    }
    return true;
  }
  // Every stage has at least `need` free blocks.
  bool has_free(const StageBlocks& need) const {
    for (size_t st = 0; st < free_.size(); ++st) {
      if (need[st] > free_[st]) return false;
    }
    return true;
  }

  // A new sequence takes blocks for n entries besides its chunk (copies of cached prefix blocks).
  void take_blocks(SeqId id, int n) {
    for (int st = 0; st < kv_.n_stages(); ++st) free_[size_t(st)] -= kv_.blocks_to_append(st, id, n);
  }

  void add_chunk(const SchedulerSequence& s, int n, int n_scoring) {
    for (int st = 0; st < kv_.n_stages(); ++st) free_[size_t(st)] -= kv_.blocks_to_append(st, s.id, n + n_scoring);
    budget_ -= n + n_scoring;
    out_.chunks.push_back({s.id, s.n_cached, n, n_scoring});
  }

  // Takes the newest active sequence other than `keep` out of the batch and gives its blocks (and any chunk it
  // already has in this step) back. Returns false when `keep` is the only one left.
  bool preempt_newest_other_than(SeqId keep) {
    for (int i = int(active_.size()) - 1; i >= 0; --i) {
      const SchedulerSequence victim = active_[size_t(i)];
      if (victim.id == keep) continue;
      for (int st = 0; st < kv_.n_stages(); ++st) free_[size_t(st)] += kv_.blocks_held(st, victim.id);
      for (auto it = out_.chunks.begin(); it != out_.chunks.end();) {
        if (it->id == victim.id) {
          const int n = it->n + it->n_scoring;
          for (int st = 0; st < kv_.n_stages(); ++st) free_[size_t(st)] += kv_.blocks_to_append(st, victim.id, n);
          budget_ += n;
          it = out_.chunks.erase(it);
        } else {
          ++it;
        }
      }
      out_.preempted.push_back(victim.id);
      active_.erase(active_.begin() + i);
      return true;
    }
    return false;
  }

  void drop_unservable(SeqId id) {
    out_.unservable.push_back(id);
    std::erase_if(active_, [&](const SchedulerSequence& s) { return s.id == id; });
  }

 private:
  std::vector<SchedulerSequence> active_;
  const PipelineKv& kv_;
  Schedule out_;
  StageBlocks free_;
  int budget_;
};

bool is_decoding(const SchedulerSequence& s) { return s.n_tokens - s.n_cached == 1; }

// The most prompt tokens s may take in this step's chunk: its remaining prompt, up to the next compression point.
int chunk_limit(const SchedulerSequence& s, const SchedulerLimits& limits) {
  const int remaining = s.n_tokens - s.n_cached;
  if (limits.prefill_chunk <= 0) return remaining;
  return std::min(remaining, (s.n_cached / limits.prefill_chunk + 1) * limits.prefill_chunk - s.n_cached);
}

// The scoring rows a chunk of n tokens of s carries: where it ends at a compression point before the prefill's end.
int scoring_rows(const SchedulerSequence& s, int n, const SchedulerLimits& limits) {
  const int end = s.n_cached + n;
  return limits.prefill_chunk > 0 && end % limits.prefill_chunk == 0 && end < s.n_tokens ? s.n_scoring : 0;
}

}  // namespace

Schedule schedule_step(const std::vector<SchedulerSequence>& running, const std::deque<SchedulerSequence>& waiting,
                       std::span<const SeqId> releasing, const PipelineKv& kv, const SchedulerLimits& limits) {
  StepBuilder step(running, releasing, kv, limits.max_batch_tokens);

  // 1. Decode tokens: preempt from the newest end until every decoding sequence gets its block.
  for (;;) {
    StageBlocks need(size_t(kv.n_stages()), 0);
    for (const SchedulerSequence& s : step.active()) {
      if (!is_decoding(s)) continue;
      for (int st = 0; st < kv.n_stages(); ++st) need[size_t(st)] += kv.blocks_to_append(st, s.id, 1);
    }
    if (step.has_free(need)) break;
    if (step.active().size() == 1) {
      step.drop_unservable(step.active().front().id);  // alone and the pool is full: it cannot grow
      break;
    }
    step.preempt_newest_other_than(-1);
  }
  for (const SchedulerSequence& s : std::vector<SchedulerSequence>(step.active())) {
    if (is_decoding(s) && step.budget() > 0) step.add_chunk(s, 1, 0);
  }

  // 2. The next prompt chunk of running sequences that are still prefilling. When a chunk does not fit, the
  //    newest sequence gives way, which is the asking one itself when it is the newest (as in vLLM): a new prompt
  //    never evicts older sequences that are already decoding.
  bool stalled = false;
  for (size_t i = 0; i < step.active().size() && step.budget() > 0;) {
    const SchedulerSequence s = step.active()[i];
    const int remaining = s.n_tokens - s.n_cached;
    if (remaining <= 1) {
      ++i;
      continue;
    }
    const int n = std::min(chunk_limit(s, limits), step.budget());
    const int n_scoring = scoring_rows(s, n, limits);
    while (!step.fits(s.id, n + n_scoring) && step.active().back().id != s.id) step.preempt_newest_other_than(s.id);
    if (!step.fits(s.id, n + n_scoring)) {
      if (step.active().size() == 1) {
        step.drop_unservable(s.id);  // alone with the whole pool and still too big
      } else {
        stalled = true;  // s is the newest: it keeps its blocks and waits for older sequences to finish
      }
      break;
    }
    step.add_chunk(s, n, n_scoring);
    ++i;
  }

  // 3. Admission in arrival order, without skipping, so a long prompt is never starved by short ones. Its peak
  //    (the whole remaining prompt, or what chunked prefill compression bounds it to) must fit, plus the
  //    watermark that keeps room for the running sequences' decodes (none when nothing runs: a prompt that fits
  //    the empty pool must not wait forever); nobody is admitted in a step that had to preempt or in which a
  //    running prompt could not take its chunk.
  StageBlocks watermark(size_t(kv.n_stages()));
  for (int st = 0; st < kv.n_stages(); ++st) {
    watermark[size_t(st)] = int64_t(std::ceil(limits.watermark * double(kv.n_total(st))));
  }
  const StageBlocks nothing(size_t(kv.n_stages()), 0);
  int n_running = int(step.active().size());
  for (const SchedulerSequence& s : waiting) {
    if (n_running >= limits.max_running || step.budget() <= 0 || !step.out().preempted.empty() || stalled) break;
    const int remaining = s.n_tokens - s.n_cached;
    // Copied prefix blocks come whole (the cached part ends at a block boundary): they take as many blocks as
    // appending their tokens would.
    const StageBlocks& keep_free = n_running == 0 ? nothing : watermark;
    if (s.peak_entries.empty() ? !step.fits(s.id, s.n_copied + remaining, keep_free)
                               : !step.fits_peak(s.peak_entries, keep_free)) {
      break;
    }
    step.out().admitted.push_back(s.id);
    step.take_blocks(s.id, s.n_copied);
    const int n = std::min(chunk_limit(s, limits), step.budget());
    step.add_chunk(s, n, scoring_rows(s, n, limits));
    ++n_running;
  }
  return step.out();
}

}  // namespace strata
