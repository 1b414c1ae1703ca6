#include "routing/sink_registry.h"

#include <utility>

namespace strata {

void SinkRegistry::add(EventQueueSink* sink) {
  std::lock_guard lock(mutex_);
  sinks_.insert(sink);
}

void SinkRegistry::remove(EventQueueSink* sink) {
  std::lock_guard lock(mutex_);
  sinks_.erase(sink);
}

void SinkRegistry::cancel_all() {
  std::lock_guard lock(mutex_);
  for (EventQueueSink* sink : sinks_) {
    sink->cancel();
    sink->set_waker(nullptr);
  }
}

int SinkRegistry::size() const {
  std::lock_guard lock(mutex_);
  return int(sinks_.size());
}

SinkLease::SinkLease(SinkRegistry& registry, std::shared_ptr<EventQueueSink> sink, boost::asio::steady_timer& timer)
    : registry_(registry), sink_(std::move(sink)) {
  registry_.add(sink_.get());
  sink_->set_waker(&timer);
}

SinkLease::~SinkLease() {
  if (!finished_) sink_->cancel();
  sink_->set_waker(nullptr);
  registry_.remove(sink_.get());
}

}  // namespace strata
