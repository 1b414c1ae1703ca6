#include "daemon/commands/command_line.h"

#include <algorithm>
#include <sstream>

#include "routing/api_keys.h"

namespace strata {

// text as a whole number, or std::invalid_argument naming --flag.
static double parse_number(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw std::invalid_argument("--" + flag + ": expected a number, got '" + text + "'");
  }
  return x;
}

CommandLine::CommandLine(int argc, char** argv, const std::vector<std::string>& flags_with_value,
                         const std::vector<std::string>& switches, const std::vector<std::string>& repeatable) {
  auto contains = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (contains(switches, name) && !inline_value) {
      values_[name].push_back("true");
      continue;
    }
    if (!contains(flags_with_value, name)) throw std::invalid_argument("unknown flag --" + name);
    if (!inline_value) {
      if (i + 1 >= argc) throw std::invalid_argument("--" + name + " needs a value");
      value = argv[++i];
    }
    if (has(name) && !contains(repeatable, name)) throw std::invalid_argument("--" + name + " given twice");
    values_[name].push_back(value);
  }
}

std::string CommandLine::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

int CommandLine::get_int(const std::string& name, int fallback) const {
  if (!has(name)) return fallback;
  const std::string v = get(name);
  size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw std::invalid_argument("--" + name + ": expected an integer, got '" + v + "'");
  return x;
}

double CommandLine::get_double(const std::string& name, double fallback) const {
  return has(name) ? parse_number(name, get(name)) : fallback;
}

std::vector<std::string> CommandLine::get_all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::vector<std::string> CommandLine::get_list(const std::string& name, const std::string& fallback) const {
  std::vector<std::string> out;
  std::stringstream ss(get(name, fallback));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<double> CommandLine::get_numbers(const std::string& name, const std::string& fallback) const {
  std::vector<double> out;
  for (const std::string& item : get_list(name, fallback)) out.push_back(parse_number(name, item));
  return out;
}

ServerConfig load_command_config(const CommandLine& cl) {
  ServerConfig config = load_server_config(cl.get("config", "configs/smollm2-cpu.yaml"));
  for (const std::string& s : cl.get_all("set")) apply_config_override(config, s);
  return config;
}

void apply_listener_flags(const CommandLine& cl, ServerConfig& config) {
  if (cl.has("port")) apply_config_override(config, "server.port=" + cl.get("port"));
  if (cl.has("host")) apply_config_override(config, "server.host=" + cl.get("host"));
  for (const std::string& key : cl.get_all("api-key")) {
    const std::string problem = api_key_problem(key);
    if (!problem.empty()) throw ConfigError("--api-key: " + problem);
    config.server.api_keys.push_back(key);
  }
}

}  // namespace strata
