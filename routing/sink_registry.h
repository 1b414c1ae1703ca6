#pragma once
// The sinks of the requests in flight (SinkRegistry), so that HttpServer::stop() can silence them before the
// io_context goes away, and a session's hold on one of them (SinkLease).
#include <memory>
#include <mutex>
#include <unordered_set>

#include <boost/asio/steady_timer.hpp>

#include "routing/event_queue_sink.h"

namespace strata {

class SinkRegistry {
 public:
  void add(EventQueueSink* sink);
  void remove(EventQueueSink* sink);
  void cancel_all();
  int size() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_set<EventQueueSink*> sinks_;
};

// A session's hold on a request's sink: registered and woken through the timer while it lives; the request is
// cancelled on the way out unless it finished.
class SinkLease {
 public:
  SinkLease(SinkRegistry& registry, std::shared_ptr<EventQueueSink> sink, boost::asio::steady_timer& timer);
  ~SinkLease();
  SinkLease(const SinkLease&) = delete;
  SinkLease& operator=(const SinkLease&) = delete;

  void finish() { finished_ = true; }

 private:
  SinkRegistry& registry_;
  std::shared_ptr<EventQueueSink> sink_;
  bool finished_ = false;
};

}  // namespace strata
