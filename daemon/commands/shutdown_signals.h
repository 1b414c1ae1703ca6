#pragma once
// How strata serve and strata route learn that they are to stop: SIGINT, SIGTERM and SIGUSR1 post a semaphore
// that the main thread waits on. A handler, not sigwait: libraries start threads before main (OpenBLAS), and a
// signal delivered to one of those must still end in a clean shutdown, also when it arrives while the model is
// loading. The first signal starts a drain; a SIGINT or SIGTERM after it ends at once. SIGUSR1 only ever starts a
// drain: mpirun forwards it to every rank at once (it answers SIGTERM by killing the world a second later), and a
// supervisor that signals every process of the group as well as mpirun must not turn its one stop into two
// (docs/decisions.md).
#include <chrono>

namespace strata {

// Installs the handlers (and ignores SIGPIPE: a client gone mid-write is an error code, not the end).
void install_shutdown_signals();
// Blocks until a signal arrives or post_shutdown() is called.
void wait_for_shutdown();
// Waits up to `timeout`; true when a signal (or a post) came.
bool wait_for_signal(std::chrono::milliseconds timeout);
// Wakes the waiter as a signal would (a rank failure).
void post_shutdown();
// The last signal received, and how many SIGINT and SIGTERM came so far.
int last_signal();
int n_ending_signals();

}  // namespace strata
