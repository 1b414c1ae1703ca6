#include "daemon/commands/machine_info.h"

#include <fstream>
#include <thread>

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
  return {{"cpu", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()}};
}

std::string command_text(const std::string& command, int argc, char** argv) {
  std::string text = "strata " + command;
  for (int i = 0; i < argc; ++i) text += std::string(" ") + argv[i];
  return text;
}

}  // namespace strata
