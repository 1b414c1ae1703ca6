#include "daemon/commands/shutdown_signals.h"

#include <semaphore.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <csignal>

namespace strata {
namespace {

sem_t g_shutdown;
std::atomic<int> g_signal{0};
std::atomic<int> g_n_ending_signals{0};  // SIGINT and SIGTERM received

void on_signal(int signal) {
  g_signal = signal;
  if (signal != SIGUSR1) ++g_n_ending_signals;  // lock-free, hence async-signal-safe
  sem_post(&g_shutdown);  // async-signal-safe
}

}  // namespace

void install_shutdown_signals() {
  sem_init(&g_shutdown, 0, 0);
  struct sigaction action{};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

void wait_for_shutdown() {
  while (sem_wait(&g_shutdown) != 0) {
  }
}

bool wait_for_signal(std::chrono::milliseconds timeout) {
  timespec deadline{};
  clock_gettime(CLOCK_REALTIME, &deadline);
  const long long ns = deadline.tv_nsec + std::chrono::nanoseconds(timeout).count();
  deadline.tv_sec += time_t(ns / 1000000000);
  deadline.tv_nsec = long(ns % 1000000000);
  while (sem_timedwait(&g_shutdown, &deadline) != 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

void post_shutdown() { sem_post(&g_shutdown); }

int last_signal() { return g_signal.load(); }

int n_ending_signals() { return g_n_ending_signals.load(); }

}  // namespace strata
