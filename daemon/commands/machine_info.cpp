#include "daemon/commands/machine_info.h"

#include <fstream>
#include <thread>

#include "kernels/cpu/amx_probe.h"
#include "kernels/cpu/quantized_dot.h"

namespace strata {

static std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

nlohmann::json machine_json() {
  return {{"cpu", cpu_model()},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"cpu_kernels", cpu::cpu_isa_name(cpu::best_cpu_isa())},
          {"amx", cpu::amx_summary()}};
}

// An argument as a POSIX shell reads it back: as it is when it holds only safe characters, else in single
// quotes (an empty value such as `--quantized ""` must survive being pasted into a shell).
static std::string shell_quoted(const std::string& arg) {
  const bool safe = !arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                          "0123456789-_=+,.:/@%") == std::string::npos;
  if (safe) return arg;
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string command_text(const std::string& command, int argc, char** argv) {
  std::string text = "strata " + command;
  for (int i = 0; i < argc; ++i) text += " " + shell_quoted(argv[i]);
  return text;
}

}  // namespace strata
