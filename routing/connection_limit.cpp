#include "routing/connection_limit.h"

namespace strata {

std::optional<ConnectionLimit::Slot> ConnectionLimit::try_take() {
  int n = n_open_.load(std::memory_order_acquire);
  do {
    if (n >= max_open_) return std::nullopt;
  } while (!n_open_.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel));
  return Slot(this);
}

}  // namespace strata
