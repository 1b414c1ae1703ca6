#include "cache/policy_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace strata {
namespace {

std::string trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string_view::npos) return "";
  const size_t b = s.find_last_not_of(" \t");
  return std::string(s.substr(a, b - a + 1));
}

bool parse_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(out);
}

}  // namespace

PolicySpec parse_policy_spec(std::string_view text) {
  PolicySpec spec;
  const size_t colon = text.find(':');
  spec.name = trim(text.substr(0, colon));
  if (spec.name.empty()) throw PolicyError("", "a KV compression policy needs a name, e.g. 'snapkv:budget=128'");
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || trim(item.substr(0, eq)).empty()) {
      throw PolicyError("", spec.name + ": expected key=value, got '" + item + "'");
    }
    const std::string key = trim(item.substr(0, eq));
    if (spec.params.count(key)) throw PolicyError(key, spec.name + ": " + key + " is given twice");
    spec.params[key] = trim(item.substr(eq + 1));
  }
  return spec;
}

std::string to_string(const PolicySpec& spec) {
  std::string text = spec.name;
  char sep = ':';
  for (const auto& [k, v] : spec.params) {
    text += sep + k + "=" + v;
    sep = ',';
  }
  return text;
}

int Budget::resolve(int prompt_len) const {
  if (fraction > 0.0) return std::max(1, int(std::ceil(fraction * prompt_len)));
  return std::max(1, tokens);
}

const std::string* ParamReader::find(const std::string& key) {
  read_.push_back(key);
  auto it = spec_.params.find(key);
  return it == spec_.params.end() ? nullptr : &it->second;
}

void ParamReader::fail(const std::string& key, const std::string& what) const {
  throw PolicyError(key, spec_.name + ": " + key + ": " + what);
}

int ParamReader::get_int(const std::string& key, int fallback, int min, int max) {
  const std::string* v = find(key);
  if (!v) return fallback;
  double x = 0;
  if (!parse_number(*v, x) || x != std::floor(x) || x < min || x > max) {
    fail(key, "expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got '" + *v + "'");
  }
  return int(x);
}

double ParamReader::get_double(const std::string& key, double fallback, double min, double max) {
  const std::string* v = find(key);
  if (!v) return fallback;
  double x = 0;
  if (!parse_number(*v, x) || x < min || x > max) {
    fail(key, "expected a number in [" + std::to_string(min) + ", " + std::to_string(max) + "], got '" + *v + "'");
  }
  return x;
}

bool ParamReader::get_bool(const std::string& key, bool fallback) {
  const std::string* v = find(key);
  if (!v) return fallback;
  if (*v == "true" || *v == "1") return true;
  if (*v == "false" || *v == "0") return false;
  fail(key, "expected true or false, got '" + *v + "'");
}

std::string ParamReader::get_choice(const std::string& key, const std::string& fallback,
                                    const std::vector<std::string>& choices) {
  const std::string* v = find(key);
  if (!v) return fallback;
  if (std::find(choices.begin(), choices.end(), *v) != choices.end()) return *v;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  fail(key, "expected one of " + list + ", got '" + *v + "'");
}

Budget ParamReader::get_budget(const std::string& key, Budget fallback) {
  const std::string* v = find(key);
  if (!v) return fallback;
  Budget b;
  double x = 0;
  if (!v->empty() && v->back() == '%') {
    if (!parse_number(v->substr(0, v->size() - 1), x) || x <= 0 || x > 100) {
      fail(key, "expected a percentage in (0%, 100%], got '" + *v + "'");
    }
    b.fraction = x / 100.0;
  } else if (parse_number(*v, x) && x > 0 && x < 1) {
    b.fraction = x;
  } else if (std::all_of(v->begin(), v->end(), [](unsigned char c) { return std::isdigit(c) != 0; }) &&
             parse_number(*v, x) && x >= 1 && x <= 1e7) {
    b.tokens = int(x);  // digits only: '1.0' is not read as one token where 100% was meant
  } else {
    fail(key, "expected a token count (a whole number >= 1, e.g. 128) or a fraction of the prompt ('20%' or 0.2), "
              "got '" + *v + "'" + (parse_number(*v, x) && x == 1 ? " (the whole prompt is 100%)" : ""));
  }
  return b;
}

PolicySpec ParamReader::get_prefixed(const std::string& prefix, const std::string& name) {
  PolicySpec inner;
  inner.name = name;
  for (const auto& [k, v] : spec_.params) {
    if (k.rfind(prefix, 0) != 0) continue;
    read_.push_back(k);
    inner.params[k.substr(prefix.size())] = v;
  }
  return inner;
}

void ParamReader::finish() const {
  for (const auto& [k, v] : spec_.params) {
    if (std::find(read_.begin(), read_.end(), k) == read_.end()) {
      std::string known;
      for (const std::string& r : read_) known += (known.empty() ? "" : ", ") + r;
      throw PolicyError(k, spec_.name + ": unknown parameter '" + k + "'" +
                               (known.empty() ? " (it takes none)" : " (known: " + known + ")"));
    }
  }
}

}  // namespace strata
