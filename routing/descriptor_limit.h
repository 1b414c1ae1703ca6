#pragma once
// The process's descriptor limit (RLIMIT_NOFILE) against the connections the server may hold: every connection is
// a descriptor, and a process out of descriptors cannot even refuse a connection politely.
#include <cstdint>
#include <string>

namespace strata {

// Raises the soft limit to the hard limit where that is allowed (it always is for an unprivileged process); returns
// the soft limit in force afterwards.
uint64_t raise_descriptor_limit();

// Descriptors this process holds now.
int count_open_descriptors();

// Why max_connections cannot be held under a limit of `limit` descriptors with `n_open` already taken (by the
// model, MPI, the listener, ...), or "" when it can: the connections, the refusals in flight and some headroom
// for files opened later must fit.
std::string connection_budget_problem(int max_connections, int n_open, uint64_t limit);

}  // namespace strata
