#include "routing/descriptor_limit.h"

#include <sys/resource.h>

#include <filesystem>
#include <system_error>

#include "routing/connection_limit.h"

namespace strata {
namespace {

// Descriptors beyond the connections for what opens later: logs, /proc reads, a resolver's socket.
constexpr int kHeadroom = 32;

}  // namespace

uint64_t raise_descriptor_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : uint64_t(limit.rlim_cur);
}

int count_open_descriptors() {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;  // counts the iterator's own descriptor too, which errs on the safe side
}

std::string connection_budget_problem(int max_connections, int n_open, uint64_t limit) {
  const uint64_t needed = uint64_t(max_connections) + kMaxRefusalsInFlight + uint64_t(n_open) + kHeadroom;
  if (needed <= limit) return "";
  const uint64_t fits = limit > uint64_t(n_open) + kMaxRefusalsInFlight + kHeadroom
                            ? limit - uint64_t(n_open) - kMaxRefusalsInFlight - kHeadroom
                            : 0;
  return std::to_string(max_connections) + " connections do not fit under the descriptor limit of " +
         std::to_string(limit) + " (" + std::to_string(n_open) + " open already, " +
         std::to_string(kMaxRefusalsInFlight + kHeadroom) + " kept for refusals and files); at most " +
         std::to_string(fits) + " fit: lower it, or raise the hard limit (ulimit -Hn, systemd LimitNOFILE=)";
}

}  // namespace strata
