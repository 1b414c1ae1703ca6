#pragma once
// What the benchmarks and `strata eval` record beside their raw results: the machine and the command line.
#include <string>

#include <nlohmann/json.hpp>

namespace strata {

// {"cpu": "<model name>", "hardware_threads": N, "cpu_kernels": "amx" | "avx512_vnni" | "avx512" | "avx2" |
//  "baseline",
//  "amx": "absent (...)"}: the level the quantized CPU kernels run at (kernels/cpu/quantized_dot.h), which decides
// their speed as much as the model name, and what the AMX probe found (kernels/cpu/amx_probe.h)
nlohmann::json machine_json();
// "strata <command> <args...>", quoted so that a POSIX shell runs it as typed.
std::string command_text(const std::string& command, int argc, char** argv);

}  // namespace strata
