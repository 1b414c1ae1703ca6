#pragma once
// How the communicators poll a wait (parallel/mpi_comm.cpp, parallel/nccl_comm.cpp): quickly at first (a step's
// collectives usually complete within microseconds), then backing off to sleeps of up to 500 us, so that ranks
// sharing cores with their peers (tests, oversubscribed CPUs) leave them the CPU.
#include <algorithm>
#include <chrono>
#include <thread>

namespace strata {

class Backoff {
 public:
  void pause() {
    if (++n_ < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(500, 20 << std::min(n_ - 64, 5))));
    }
  }

 private:
  int n_ = 0;
};

}  // namespace strata
