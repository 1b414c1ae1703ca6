#pragma once
// What the listener does when accept() fails (EMFILE, ENFILE, ENOBUFS: the process or the system is out of
// descriptors or memory): the listening socket stays readable, so retrying at once would spin and flood the log.
// The delay starts at 50 ms and doubles up to 1 s while failures go on; the log gets the first failure, then at
// most one line per 10 s with the count, and one line when accepting works again.
#include <chrono>
#include <cstdint>
#include <string>

namespace strata {

class AcceptBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kFirstDelay{50};
  static constexpr std::chrono::milliseconds kMaxDelay{1000};
  static constexpr std::chrono::seconds kLogInterval{10};

  struct Decision {
    std::chrono::milliseconds delay;  // wait this long before accepting again
    std::string log;                  // a line for the log, or "" to stay quiet
  };

  // After a failed accept (error: its message).
  Decision on_failure(const std::string& error, Clock::time_point now);
  // After a successful accept: the delay starts over; a line for the log when failures came before, else "".
  std::string on_success();

 private:
  std::chrono::milliseconds delay_{0};  // 0: the last accept succeeded
  Clock::time_point last_log_{};
  bool logged_once_ = false;
  int64_t n_unlogged_ = 0;  // failures since the last line
  int64_t n_failures_ = 0;  // failures since the last success
};

}  // namespace strata
