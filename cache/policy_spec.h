#pragma once
// A compression policy as written by an operator (configuration) or a client (the API's kv_compression field):
// a name and string parameters, e.g. "pyramidkv:budget=128,window=8" or "snapkv:budget=20%". Each policy reads
// and validates its own parameters through ParamReader, so an error names the policy and the parameter.
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// A bad policy name or parameter. `param` is the parameter's name ("" for the policy name itself), so that the
// HTTP layer can answer 400 naming "kv_compression.<param>" and the configuration can name its key.
class PolicyError : public std::invalid_argument {
 public:
  PolicyError(std::string param, const std::string& message)
      : std::invalid_argument(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

struct PolicySpec {
  std::string name = "full";
  std::map<std::string, std::string> params;
  bool operator==(const PolicySpec&) const = default;
};

// "name" or "name:key=value,key=value". Throws PolicyError for malformed text.
PolicySpec parse_policy_spec(std::string_view text);
std::string to_string(const PolicySpec& spec);  // the canonical text form, parse_policy_spec's inverse

// A KV budget per layer: a token count, or a fraction of the prompt ("20%" or "0.2").
struct Budget {
  int tokens = 0;         // used when fraction == 0
  double fraction = 0.0;  // of the prompt length, in (0, 1]
  int resolve(int prompt_len) const;  // at least 1
};

// Reads one policy's parameters with defaults and range checks; finish() rejects keys nobody read.
class ParamReader {
 public:
  explicit ParamReader(const PolicySpec& spec) : spec_(spec) {}
  int get_int(const std::string& key, int fallback, int min, int max);
  double get_double(const std::string& key, double fallback, double min, double max);
  bool get_bool(const std::string& key, bool fallback);
  std::string get_choice(const std::string& key, const std::string& fallback, const std::vector<std::string>& choices);
  Budget get_budget(const std::string& key, Budget fallback);
  // The parameters whose keys start with `prefix`, without it, as the spec of policy `name` (a composed policy's
  // inner one: "kept_budget=128" gives "budget=128").
  PolicySpec get_prefixed(const std::string& prefix, const std::string& name);
  void finish() const;  // PolicyError naming the first unknown key

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string* find(const std::string& key);
  const PolicySpec& spec_;
  std::vector<std::string> read_;
};

}  // namespace strata
