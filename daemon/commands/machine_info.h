#pragma once
// What the benchmarks and `strata eval` record beside their raw results: the machine and the command line.
#include <string>

#include <nlohmann/json.hpp>

namespace strata {

// {"cpu": "<model name>", "hardware_threads": N}
nlohmann::json machine_json();
// "strata <command> <args...>", quoted so that a POSIX shell runs it as typed.
std::string command_text(const std::string& command, int argc, char** argv);

}  // namespace strata
