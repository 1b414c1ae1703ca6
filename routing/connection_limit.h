#pragma once
// A bound on the connections a server holds at once (server.max_connections): a connection takes a slot when it is
// accepted and gives it back when it closes; past the bound, a connection is refused (503, then closed).
#include <atomic>
#include <optional>
#include <utility>

namespace strata {

// Refused connections each hold a descriptor while their 503 is written; while this many are, new connections
// wait in the listen backlog, so that a flood cannot take the descriptors the bound protects.
constexpr int kMaxRefusalsInFlight = 64;

class ConnectionLimit {
 public:
  // A taken slot; given back when destroyed. Move-only.
  class Slot {
   public:
    Slot(Slot&& other) noexcept : limit_(std::exchange(other.limit_, nullptr)) {}
    Slot& operator=(Slot&&) = delete;
    Slot(const Slot&) = delete;
    ~Slot() {
      if (limit_) limit_->n_open_.fetch_sub(1, std::memory_order_acq_rel);
    }

   private:
    friend class ConnectionLimit;
    explicit Slot(ConnectionLimit* limit) : limit_(limit) {}
    ConnectionLimit* limit_;
  };

  explicit ConnectionLimit(int max_open) : max_open_(max_open) {}

  // A slot, or none when max_open are taken. The limit must outlive its slots.
  std::optional<Slot> try_take();
  int n_open() const { return n_open_.load(std::memory_order_acquire); }
  int max_open() const { return max_open_; }

 private:
  const int max_open_;
  std::atomic<int> n_open_{0};
};

}  // namespace strata
