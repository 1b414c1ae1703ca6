#include "daemon/commands/command_line.h"

#include <algorithm>

namespace strata {

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
  if (!has(name)) return fallback;
  const std::string v = get(name);
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw std::invalid_argument("--" + name + ": expected a number, got '" + v + "'");
  return x;
}

std::vector<std::string> CommandLine::get_all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace strata
