#include "daemon/server_config.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"
#include "router/replica_endpoint.h"
#include "routing/api_keys.h"

namespace strata {
namespace {

// One settable key: parses a scalar's text into the config, throwing ConfigError with `where` on bad values.
using Setter = std::function<void(ServerConfig&, const std::string& text, const std::string& where)>;

int64_t parse_int(const std::string& text, const std::string& where, int64_t min, int64_t max) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < min || v > max) {
    throw ConfigError(where + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                      "], got '" + text + "'");
  }
  return v;
}

std::string parse_choice(const std::string& text, const std::string& where, const std::vector<std::string>& ok) {
  if (std::find(ok.begin(), ok.end(), text) != ok.end()) return text;
  std::string list;
  for (const std::string& o : ok) list += (list.empty() ? "" : ", ") + o;
  throw ConfigError(where + ": expected one of " + list + ", got '" + text + "'");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

// Keys as given, each checked; an error names where and which entry, never the key itself.
std::vector<std::string> checked_api_keys(std::vector<std::string> keys, const std::string& where) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string problem = api_key_problem(keys[i]);
    if (!problem.empty()) throw ConfigError(where + ": entry " + std::to_string(i + 1) + ": " + problem);
  }
  return keys;
}

// Replica URLs as given, each checked (router/replica_endpoint.h).
std::vector<std::string> checked_replicas(std::vector<std::string> urls, const std::string& where) {
  for (const std::string& url : urls) {
    try {
      parse_replica_url(url);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(where + ": " + e.what());
    }
  }
  return urls;
}

// The setter of every configuration key.
// Long: a table with one entry per key, in the order of the configuration file's sections.
const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"model.path", [](ServerConfig& c, const std::string& t, const std::string&) { c.model.path = t; }},
      {"model.name", [](ServerConfig& c, const std::string& t, const std::string&) { c.model.name = t; }},
      {"model.chat_template",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.model.chat_template = parse_choice(t, w, {"auto", "chatml", "llama3", "mistral"});
       }},
      {"model.system_prompt", [](ServerConfig& c, const std::string& t, const std::string&) { c.model.system_prompt = t; }},
      {"model.weight_dtype",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.model.weight_dtype = parse_choice(t, w, {"auto", "f32", "q8_0", "f16", "bf16"});
       }},
      {"server.host", [](ServerConfig& c, const std::string& t, const std::string&) { c.server.host = t; }},
      {"server.port",
       [](ServerConfig& c, const std::string& t, const std::string& w) { c.server.port = int(parse_int(t, w, 0, 65535)); }},
      {"server.threads",
       [](ServerConfig& c, const std::string& t, const std::string& w) { c.server.threads = int(parse_int(t, w, 1, 256)); }},
      {"server.max_body_bytes",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.max_body_bytes = parse_int(t, w, 1024, int64_t(1) << 30);
       }},
      {"server.max_n",
       [](ServerConfig& c, const std::string& t, const std::string& w) { c.server.max_n = int(parse_int(t, w, 1, 128)); }},
      {"server.max_prompts",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.max_prompts = int(parse_int(t, w, 1, 4096));
       }},
      {"server.access_log",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.access_log = parse_choice(t, w, {"true", "false"}) == "true";
       }},
      {"server.ignore_unknown_fields",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.ignore_unknown_fields = parse_choice(t, w, {"true", "false"}) == "true";
       }},
      {"server.max_connections",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.max_connections = int(parse_int(t, w, 1, 1 << 20));
       }},
      {"server.idle_timeout_s",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.idle_timeout_s = int(parse_int(t, w, 1, 3600));
       }},
      {"server.drain_timeout_s",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.drain_timeout_s = int(parse_int(t, w, 0, 3600));
       }},
      {"server.api_keys",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.api_keys = checked_api_keys(split_list(t), w);
       }},
      {"server.api_key_file", [](ServerConfig& c, const std::string& t, const std::string&) { c.server.api_key_file = t; }},
      {"server.metrics_require_key",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.server.metrics_require_key = parse_choice(t, w, {"true", "false"}) == "true";
       }},
      {"engine.max_running",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.max_running = int(parse_int(t, w, 1, 4096));
       }},
      {"engine.max_batch_tokens",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.max_batch_tokens = int(parse_int(t, w, 1, 1 << 20));
       }},
      {"engine.max_waiting",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.max_waiting = int(parse_int(t, w, 1, 1 << 20));
       }},
      {"engine.threads",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.threads = int(parse_int(t, w, 0, 1024));
       }},
      {"engine.activation_dtype",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.activation_dtype = parse_choice(t, w, {"auto", "f32", "int8", "int16"});
       }},
      {"engine.cpu_kernels",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.cpu_kernels = parse_choice(t, w, {"auto", "baseline", "avx2", "avx512", "avx512_vnni", "amx"});
       }},
      {"engine.backend",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.backend = parse_choice(t, w, {"cpu", "cuda"});
       }},
      {"engine.device",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.device = int(parse_int(t, w, -1, 1023));
       }},
      {"engine.cuda_overlap",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.engine.cuda_overlap = parse_choice(t, w, {"on", "off"}) == "on";
       }},
      {"kv_cache.block_size",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.kv_cache.block_size = int(parse_int(t, w, 1, 1024));
       }},
      {"kv_cache.memory_mib",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.kv_cache.memory_mib = parse_int(t, w, 1, int64_t(1) << 24);
       }},
      {"kv_cache.dtype",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.kv_cache.dtype = parse_choice(t, w, {"f32", "f16", "bf16", "int8", "int4", "int2"});
       }},
      {"kv_cache.policy",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         try {
           validate_policy(parse_policy_spec(t));
         } catch (const PolicyError& e) {
           throw ConfigError(w + ": " + e.what());
         }
         c.kv_cache.policy = t;
       }},
      {"kv_cache.layer_overrides",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         try {
           parse_layer_overrides(t);
         } catch (const PolicyError& e) {
           throw ConfigError(w + ": " + e.what());
         }
         c.kv_cache.layer_overrides = t;
       }},
      {"kv_cache.request_policies",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         for (const std::string& name : split_list(t)) {
           if (name != "all" && name != "none") parse_choice(name, w, policy_names());
         }
         c.kv_cache.request_policies = t;
       }},
      {"kv_cache.pod_blocks",
       [](ServerConfig& c, const std::string& t, const std::string&) { c.kv_cache.pod_blocks = t; }},
      {"kv_cache.prefix_caching",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.kv_cache.prefix_caching = parse_choice(t, w, {"on", "off"}) == "on";
       }},
      {"kv_cache.prefill_compression",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.kv_cache.prefill_compression = parse_choice(t, w, {"auto", "end", "chunked"});
       }},
      {"kv_cache.prefill_chunk",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.kv_cache.prefill_chunk = int(parse_int(t, w, 1, 1 << 20));
       }},
      {"parallel.tp",
       [](ServerConfig& c, const std::string& t, const std::string& w) { c.parallel.tp = int(parse_int(t, w, 1, 1024)); }},
      {"parallel.pp",
       [](ServerConfig& c, const std::string& t, const std::string& w) { c.parallel.pp = int(parse_int(t, w, 1, 1024)); }},
      {"parallel.timeout_s",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.parallel.timeout_s = int(parse_int(t, w, 1, 3600));
       }},
      {"parallel.micro_batches",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.parallel.micro_batches = int(parse_int(t, w, 1, 1024));
       }},
      {"router.replicas",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.replicas = checked_replicas(split_list(t), w);
       }},
      {"router.policy",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.policy = parse_choice(t, w, {"cache_aware", "round_robin"});
       }},
      {"router.busy_threshold",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.busy_threshold = int(parse_int(t, w, 1, 1 << 20));
       }},
      {"router.index_blocks",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.index_blocks = parse_int(t, w, 1, int64_t(1) << 32);
       }},
      {"router.health_interval_ms",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.health_interval_ms = int(parse_int(t, w, 10, 60000));
       }},
      {"router.health_timeout_ms",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.health_timeout_ms = int(parse_int(t, w, 10, 60000));
       }},
      {"router.connect_timeout_ms",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.connect_timeout_ms = int(parse_int(t, w, 10, 60000));
       }},
      {"router.upstream_timeout_s",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.upstream_timeout_s = int(parse_int(t, w, 1, 86400));
       }},
      {"router.forward_api_key",
       [](ServerConfig& c, const std::string& t, const std::string& w) {
         c.router.forward_api_key = parse_choice(t, w, {"true", "false"}) == "true";
       }},
  };
  return table;
}

void set_key(ServerConfig& config, const std::string& key, const std::string& value, const std::string& where) {
  auto it = setters().find(key);
  if (it == setters().end()) {
    std::string known;
    for (const auto& [k, _] : setters()) known += (known.empty() ? "" : ", ") + k;
    throw ConfigError(where + ": unknown key (known keys: " + known + ")");
  }
  it->second(config, value, where);
}

// A mapping's key as text. A key that is itself a list or a mapping (YAML's "? [a, b]: ...") is an error naming
// the file and the line, not yaml-cpp's bare "bad conversion" (found by tests/fuzz/server_config_fuzz.cpp).
std::string key_name(const YAML::Node& key, const std::string& where) {
  if (!key.IsScalar()) {
    throw ConfigError(where + ": line " + std::to_string(key.Mark().line + 1) + ": expected a key name, found a " +
                      (key.IsSequence() ? "list" : key.IsMap() ? "mapping" : "null"));
  }
  return key.Scalar();
}

// A YAML list of scalars (`what`: what its items are, for the error).
std::vector<std::string> scalar_list(const YAML::Node& list, const std::string& where, const std::string& what) {
  std::vector<std::string> items;
  for (const auto& item : list) {
    if (!item.IsScalar()) throw ConfigError(where + ": expected a list of " + what);
    items.push_back(item.Scalar());
  }
  return items;
}

// yaml-cpp keeps both entries of a key given twice in one mapping, and the server would silently take the last:
// a deployment file with `api_keys: [KEY]` added above the shipped `api_keys: []` would start open to anyone.
void check_unique_keys(const YAML::Node& mapping, const std::string& path, const std::string& prefix) {
  std::map<std::string, int> first_line;
  for (const auto& entry : mapping) {
    if (!entry.first.IsScalar()) continue;  // key_name() names that error
    const int line = entry.first.Mark().line + 1;
    const auto [it, added] = first_line.try_emplace(entry.first.Scalar(), line);
    if (!added) {
      throw ConfigError(path + ": " + prefix + entry.first.Scalar() + ": given twice, at lines " +
                        std::to_string(it->second) + " and " + std::to_string(line) + " (remove one)");
    }
  }
}

}  // namespace

std::vector<std::string> configured_api_keys(const ServerConfig& config) {
  std::vector<std::string> keys = config.server.api_keys;
  const std::string& path = config.server.api_key_file;
  if (path.empty()) return keys;
  const std::string where = config.file + ": server.api_key_file";
  std::ifstream file(path);
  if (!file.is_open()) throw ConfigError(where + ": cannot read '" + path + "'");
  std::ostringstream text;
  text << file.rdbuf();
  const std::vector<std::string> from_file = parse_api_key_lines(text.str());
  if (from_file.empty()) throw ConfigError(where + ": '" + path + "' holds no key");
  const std::vector<std::string> checked = checked_api_keys(from_file, where + " ('" + path + "')");
  keys.insert(keys.end(), checked.begin(), checked.end());
  return keys;
}

std::vector<std::string> request_policy_names(const ServerConfig& config) {
  const std::vector<std::string> listed = split_list(config.kv_cache.request_policies);
  if (listed.size() == 1 && listed[0] == "none") return {};
  if (listed.size() != 1 || listed[0] != "all") return listed;
  return policy_names();
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const auto& [k, _] : setters()) keys.push_back(k);
  return keys;
}

ServerConfig load_server_config(const std::string& path) {
  ServerConfig config;
  config.file = path;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw ConfigError(path + ": cannot open the configuration file");
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (root.IsNull()) return config;
  if (!root.IsMap()) throw ConfigError(path + ": expected a mapping of sections at the top level");
  check_unique_keys(root, path, "");
  for (const auto& section : root) {
    const std::string name = key_name(section.first, path);
    if (!section.second.IsMap()) {
      throw ConfigError(path + ": " + name + ": expected a mapping of keys, e.g. '" + name + ": {key: value}'");
    }
    check_unique_keys(section.second, path, name + ".");
    for (const auto& entry : section.second) {
      const std::string key = name + "." + key_name(entry.first, path + ": " + name);
      const std::string where = path + ": " + key;
      if (key == "server.api_keys" && entry.second.IsSequence()) {  // the keys that take a YAML list
        config.server.api_keys = checked_api_keys(scalar_list(entry.second, where, "keys"), where);
        continue;
      }
      if (key == "router.replicas" && entry.second.IsSequence()) {
        config.router.replicas = checked_replicas(scalar_list(entry.second, where, "URLs"), where);
        continue;
      }
      if (!entry.second.IsScalar()) throw ConfigError(where + ": expected a single value");
      set_key(config, key, entry.second.Scalar(), where);
    }
  }
  return config;
}

void apply_config_override(ServerConfig& config, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) throw ConfigError("--set " + assignment + ": expected section.key=value");
  const std::string key = assignment.substr(0, eq);
  set_key(config, key, assignment.substr(eq + 1), "--set " + key);
}

}  // namespace strata
