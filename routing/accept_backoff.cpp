#include "routing/accept_backoff.h"

#include <algorithm>

namespace strata {

AcceptBackoff::Decision AcceptBackoff::on_failure(const std::string& error, Clock::time_point now) {
  delay_ = delay_.count() == 0 ? kFirstDelay : std::min(delay_ * 2, kMaxDelay);
  ++n_failures_;
  ++n_unlogged_;
  Decision decision{delay_, ""};
  if (!logged_once_ || now - last_log_ >= kLogInterval) {
    decision.log = "accept failed: " + error;
    if (n_unlogged_ > 1) decision.log += " (" + std::to_string(n_unlogged_) + " times since the last report)";
    decision.log += "; retrying in up to " + std::to_string(kMaxDelay.count()) + " ms";
    logged_once_ = true;
    last_log_ = now;
    n_unlogged_ = 0;
  }
  return decision;
}

std::string AcceptBackoff::on_success() {
  std::string log;
  if (n_failures_ > 0) log = "accepting connections again after " + std::to_string(n_failures_) + " failed accepts";
  delay_ = std::chrono::milliseconds(0);
  n_failures_ = 0;
  n_unlogged_ = 0;
  logged_once_ = false;
  return log;
}

}  // namespace strata
