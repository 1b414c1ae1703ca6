#pragma once
// The bridge from the engine thread to a session: a locked queue plus a wake-up posted to the session's strand.
// Queue depth is bounded by the request itself: at most n * max_tokens deltas plus n + 1 closing events.
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>

#include <boost/asio/steady_timer.hpp>

#include "leader/generation.h"

namespace strata {

class EventQueueSink final : public GenerationSink, public std::enable_shared_from_this<EventQueueSink> {
 public:
  // Engine thread: never blocks beyond the short lock.
  void on_event(GenerationEvent event) override;
  bool cancelled() const override { return cancelled_.load(std::memory_order_relaxed); }

  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }

  // Session strand: the timer to cancel when events arrive; nullptr stops the wake-ups (the timer is going away).
  void set_waker(boost::asio::steady_timer* timer);
  bool has_events() const;
  std::deque<GenerationEvent> take();

 private:
  // Runs on the session's strand, where the timer lives; the timer is still there while waker_ is set.
  void wake();

  mutable std::mutex mutex_;
  std::deque<GenerationEvent> events_;
  boost::asio::steady_timer* waker_ = nullptr;
  bool wake_posted_ = false;
  std::atomic<bool> cancelled_{false};
};

}  // namespace strata
