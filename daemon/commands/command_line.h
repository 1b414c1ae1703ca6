#pragma once
// A small parser for `--flag value` / `--flag=value` / `--switch` arguments, shared by the subcommands.
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/server_config.h"

namespace strata {

class CommandLine {
 public:
  // flags_with_value: names (without "--") that take a value; switches: names that do not.
  // `repeatable` flags may appear several times (values kept in order). Throws std::invalid_argument for
  // unknown flags or missing values, naming them.
  CommandLine(int argc, char** argv, const std::vector<std::string>& flags_with_value,
              const std::vector<std::string>& switches, const std::vector<std::string>& repeatable = {});

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  int get_int(const std::string& name, int fallback) const;
  double get_double(const std::string& name, double fallback) const;
  std::vector<std::string> get_all(const std::string& name) const;
  // A comma-separated value ("64,128,20%"), empty items dropped; `fallback` when the flag is absent.
  std::vector<std::string> get_list(const std::string& name, const std::string& fallback = "") const;
  // The same, each item a number (throws std::invalid_argument naming the flag and the item).
  std::vector<double> get_numbers(const std::string& name, const std::string& fallback = "") const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// The configuration a subcommand runs with: the file of --config (configs/smollm2-cpu.yaml by default), then
// every --set section.key=value in order.
ServerConfig load_command_config(const CommandLine& cl);
// The listener's flags of serve and route: --port and --host over server.*, each --api-key added to
// server.api_keys (a malformed key is a ConfigError naming the flag).
void apply_listener_flags(const CommandLine& cl, ServerConfig& config);

}  // namespace strata
