#include "routing/event_queue_sink.h"

#include <utility>

#include <boost/asio/post.hpp>

namespace strata {

void EventQueueSink::on_event(GenerationEvent event) {
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(event));
  if (waker_ && !wake_posted_) {
    wake_posted_ = true;
    boost::asio::post(waker_->get_executor(), [self = shared_from_this()] { self->wake(); });
  }
}

void EventQueueSink::set_waker(boost::asio::steady_timer* timer) {
  std::lock_guard lock(mutex_);
  waker_ = timer;
}

bool EventQueueSink::has_events() const {
  std::lock_guard lock(mutex_);
  return !events_.empty();
}

std::deque<GenerationEvent> EventQueueSink::take() {
  std::lock_guard lock(mutex_);
  return std::exchange(events_, {});
}

void EventQueueSink::wake() {
  std::lock_guard lock(mutex_);
  wake_posted_ = false;
  if (waker_) waker_->cancel();
}

}  // namespace strata
