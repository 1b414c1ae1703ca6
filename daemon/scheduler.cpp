#include "daemon/scheduler.h"

#include <algorithm>
#include <cmath>

namespace strata {
namespace {

// The state of one scheduling decision while it is being built.
class StepBuilder {
 public:
  StepBuilder(const std::vector<SchedulerSequence>& running, std::span<const SeqId> releasing, const KvCache& cache,
              int budget)
      : active_(running.begin(), running.end()), cache_(cache), free_(cache.pool().n_free()), budget_(budget) {
    for (SeqId id : releasing) free_ += cache.blocks_held(id);
  }

  Schedule& out() { return out_; }
  const std::vector<SchedulerSequence>& active() const { return active_; }
  int64_t free_blocks() const { return free_; }
  int budget() const { return budget_; }

  void add_chunk(const SchedulerSequence& s, int n) {
    free_ -= cache_.blocks_to_append(s.id, n);
    budget_ -= n;
    out_.chunks.push_back({s.id, s.n_cached, n});
  }

  // Takes the newest active sequence other than `keep` out of the batch and gives its blocks (and any chunk it
  // already has in this step) back. Returns false when `keep` is the only one left.
  bool preempt_newest_other_than(SeqId keep) {
    for (int i = int(active_.size()) - 1; i >= 0; --i) {
      const SchedulerSequence victim = active_[size_t(i)];
      if (victim.id == keep) continue;
      free_ += cache_.blocks_held(victim.id);
      for (auto it = out_.chunks.begin(); it != out_.chunks.end();) {
        if (it->id == victim.id) {
          free_ += cache_.blocks_to_append(victim.id, it->n);
          budget_ += it->n;
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
  const KvCache& cache_;
  Schedule out_;
  int64_t free_;
  int budget_;
};

bool is_decoding(const SchedulerSequence& s) { return s.n_tokens - s.n_cached == 1; }

}  // namespace

Schedule schedule_step(const std::vector<SchedulerSequence>& running, const std::deque<SchedulerSequence>& waiting,
                       std::span<const SeqId> releasing, const KvCache& cache, const SchedulerLimits& limits) {
  StepBuilder step(running, releasing, cache, limits.max_batch_tokens);

  // 1. Decode tokens: preempt from the newest end until every decoding sequence gets its block.
  for (;;) {
    int64_t need = 0;
    std::vector<SeqId> decoding;
    for (const SchedulerSequence& s : step.active()) {
      if (is_decoding(s)) {
        need += cache.blocks_to_append(s.id, 1);
        decoding.push_back(s.id);
      }
    }
    if (need <= step.free_blocks()) break;
    if (step.active().size() == 1) {
      step.drop_unservable(step.active().front().id);  // alone and the pool is full: it cannot grow
      break;
    }
    step.preempt_newest_other_than(-1);
  }
  for (const SchedulerSequence& s : std::vector<SchedulerSequence>(step.active())) {
    if (is_decoding(s) && step.budget() > 0) step.add_chunk(s, 1);
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
    const int n = std::min(remaining, step.budget());
    while (cache.blocks_to_append(s.id, n) > step.free_blocks() && step.active().back().id != s.id) {
      step.preempt_newest_other_than(s.id);
    }
    if (cache.blocks_to_append(s.id, n) > step.free_blocks()) {
      if (step.active().size() == 1) {
        step.drop_unservable(s.id);  // alone with the whole pool and still too big
      } else {
        stalled = true;  // s is the newest: it keeps its blocks and waits for older sequences to finish
      }
      break;
    }
    step.add_chunk(s, n);
    ++i;
  }

  // 3. Admission in arrival order, without skipping, so a long prompt is never starved by short ones. The whole
  //    remaining prompt must fit, plus the watermark that keeps room for the running sequences' decodes (none
  //    when nothing runs: a prompt that fits the empty pool must not wait forever); nobody is admitted in a step
  //    that had to preempt or in which a running prompt could not take its chunk.
  const int64_t watermark = int64_t(std::ceil(limits.watermark * double(cache.pool().n_total())));
  int n_running = int(step.active().size());
  for (const SchedulerSequence& s : waiting) {
    if (n_running >= limits.max_running || step.budget() <= 0 || !step.out().preempted.empty() || stalled) break;
    const int remaining = s.n_tokens - s.n_cached;
    const int64_t keep_free = n_running == 0 ? 0 : watermark;
    if (cache.blocks_to_append(s.id, remaining) + keep_free > step.free_blocks()) break;
    step.out().admitted.push_back(s.id);
    step.add_chunk(s, std::min(remaining, step.budget()));
    ++n_running;
  }
  return step.out();
}

}  // namespace strata
