#include "daemon/server_config.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_policy.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class ServerConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_server_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // Loads and returns the ConfigError's message (failing the test if none is thrown).
  std::string load_error(const std::string& path) {
    try {
      load_server_config(path);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << path << " loaded without an error";
    return "";
  }

  fs::path dir_;
};

std::string override_error(ServerConfig& c, const std::string& assignment) {
  try {
    apply_config_override(c, assignment);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "--set " << assignment << " was accepted";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "'" << (haystack) << "' lacks '" << (needle) << "'"

TEST_F(ServerConfigTest, DefaultCpuConfigLoads) {
  const std::string path = test::source_path("configs/smollm2-cpu.yaml");
  const ServerConfig c = load_server_config(path);
  EXPECT_EQ(c.file, path);
  EXPECT_EQ(c.model.path, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(c.model.name, "SmolLM2-135M-Instruct");
  EXPECT_EQ(c.model.chat_template, "auto");
  EXPECT_EQ(c.model.system_prompt, "default");
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.server.port, 8000);
  EXPECT_EQ(c.server.threads, 2);
  EXPECT_EQ(c.server.max_body_bytes, 4194304);
  EXPECT_EQ(c.server.max_n, 16);
  EXPECT_EQ(c.server.max_prompts, 64);
  EXPECT_TRUE(c.server.access_log);
  EXPECT_EQ(c.engine.max_running, 16);
  EXPECT_EQ(c.engine.max_batch_tokens, 512);
  EXPECT_EQ(c.engine.max_waiting, 256);
  EXPECT_EQ(c.engine.threads, 0);
  EXPECT_EQ(c.kv_cache.block_size, 16);
  EXPECT_EQ(c.kv_cache.memory_mib, 1024);
  EXPECT_EQ(c.kv_cache.policy, "full");
  EXPECT_EQ(c.kv_cache.prefill_compression, "auto");
  EXPECT_EQ(ServerConfig{}.kv_cache.prefill_compression, "auto") << "the file and the built-in default agree";
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.parallel.pp, 1);
}

TEST_F(ServerConfigTest, EveryKeyIsRead) {
  const std::string path = write("all.yaml",
                                 "model:\n"
                                 "  path: preset:llama3-8b\n"
                                 "  name: my-model\n"
                                 "  chat_template: llama3\n"
                                 "  system_prompt: \"You are terse.\"\n"
                                 "server:\n"
                                 "  host: 0.0.0.0\n"
                                 "  port: 9001\n"
                                 "  threads: 8\n"
                                 "  max_body_bytes: 2048\n"
                                 "  max_n: 4\n"
                                 "  max_prompts: 8\n"
                                 "  access_log: false\n"
                                 "engine:\n"
                                 "  max_running: 64\n"
                                 "  max_batch_tokens: 2048\n"
                                 "  max_waiting: 1000\n"
                                 "  threads: 3\n"
                                 "kv_cache:\n"
                                 "  block_size: 32\n"
                                 "  memory_mib: 70000\n"
                                 "  policy: full\n"
                                 "parallel:\n"
                                 "  tp: 4\n"
                                 "  pp: 2\n");
  const ServerConfig c = load_server_config(path);
  EXPECT_EQ(c.model.path, "preset:llama3-8b");
  EXPECT_EQ(c.model.name, "my-model");
  EXPECT_EQ(c.model.chat_template, "llama3");
  EXPECT_EQ(c.model.system_prompt, "You are terse.");
  EXPECT_EQ(c.server.host, "0.0.0.0");
  EXPECT_EQ(c.server.port, 9001);
  EXPECT_EQ(c.server.threads, 8);
  EXPECT_EQ(c.server.max_body_bytes, 2048);
  EXPECT_EQ(c.server.max_n, 4);
  EXPECT_EQ(c.server.max_prompts, 8);
  EXPECT_FALSE(c.server.access_log);
  EXPECT_EQ(c.engine.max_running, 64);
  EXPECT_EQ(c.engine.max_batch_tokens, 2048);
  EXPECT_EQ(c.engine.max_waiting, 1000);
  EXPECT_EQ(c.engine.threads, 3);
  EXPECT_EQ(c.kv_cache.block_size, 32);
  EXPECT_EQ(c.kv_cache.memory_mib, 70000);
  EXPECT_EQ(c.kv_cache.policy, "full");
  EXPECT_EQ(c.parallel.tp, 4);
  EXPECT_EQ(c.parallel.pp, 2);
}

TEST_F(ServerConfigTest, PartialAndEmptyFilesKeepDefaults) {
  const ServerConfig partial = load_server_config(write("partial.yaml", "engine:\n  max_running: 3\n"));
  EXPECT_EQ(partial.engine.max_running, 3);
  EXPECT_EQ(partial.engine.max_batch_tokens, ServerConfig{}.engine.max_batch_tokens);
  EXPECT_EQ(partial.server.port, ServerConfig{}.server.port);
  const std::string empty_path = write("empty.yaml", "# nothing but a comment\n");
  const ServerConfig empty = load_server_config(empty_path);
  EXPECT_EQ(empty.file, empty_path);
  EXPECT_EQ(empty.engine.max_running, ServerConfig{}.engine.max_running);
}

TEST_F(ServerConfigTest, UnknownKeyNamesFileAndKey) {
  const std::string path = write("unknown.yaml", "engine:\n  max_runing: 4\n");
  const std::string e = load_error(path);
  EXPECT_CONTAINS(e, path);
  EXPECT_CONTAINS(e, "engine.max_runing");
  EXPECT_CONTAINS(e, "engine.max_running");  // the known keys are listed, so the typo is easy to spot
}

TEST_F(ServerConfigTest, UnknownSectionNamesFileAndKey) {
  const std::string path = write("section.yaml", "engines:\n  max_running: 4\n");
  const std::string e = load_error(path);
  EXPECT_CONTAINS(e, path);
  EXPECT_CONTAINS(e, "engines.max_running");
}

// Found by tests/fuzz/server_config_fuzz.cpp: a key that is a list or a mapping threw yaml-cpp's "bad conversion",
// which names neither the file nor the key.
TEST_F(ServerConfigTest, KeyThatIsNotANameNamesFileAndLine) {
  const std::string section_path = write("list_key.yaml", "server:\n  port: 8000\n? [threads, 2]\n: {port: 1}\n");
  const std::string section_error = load_error(section_path);
  EXPECT_CONTAINS(section_error, section_path + ": line 3: expected a key name, found a list");
  const std::string key_path = write("map_key.yaml", "engine:\n  ? {max_running: 4}\n  : 5\n");
  const std::string key_error = load_error(key_path);
  EXPECT_CONTAINS(key_error, key_path + ": engine: line 2: expected a key name, found a mapping");
}

// yaml-cpp keeps both entries of a repeated key, and the server took the last one silently: `api_keys: [KEY]`
// added above the shipped `api_keys: []` started a server open to anyone.
TEST_F(ServerConfigTest, AKeyGivenTwiceNamesTheKeyAndBothLines) {
  const std::string path = write("twice.yaml", "server:\n  api_keys: [sk-secret-1]\n  port: 8000\n  api_keys: []\n");
  EXPECT_CONTAINS(load_error(path), path + ": server.api_keys: given twice, at lines 2 and 4");
  const std::string sections = write("sections.yaml", "engine:\n  max_running: 4\nengine:\n  threads: 2\n");
  EXPECT_CONTAINS(load_error(sections), sections + ": engine: given twice, at lines 1 and 3");
}

TEST_F(ServerConfigTest, WrongTypeNamesFileKeyAndValue) {
  const std::string path = write("type.yaml", "engine:\n  max_running: many\n");
  const std::string e = load_error(path);
  EXPECT_CONTAINS(e, path);
  EXPECT_CONTAINS(e, "engine.max_running");
  EXPECT_CONTAINS(e, "'many'");
  for (const std::string value : {"4.5", "1e3", "0x10", "12abc", "\"\"", "true"}) {
    const std::string p = write("type2.yaml", "server:\n  port: " + value + "\n");
    const std::string err = load_error(p);
    EXPECT_CONTAINS(err, p);
    EXPECT_CONTAINS(err, "server.port");
  }
}

TEST_F(ServerConfigTest, OutOfRangeValuesNameFileAndKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"server", "port: 65536"},          {"server", "port: -1"},
      {"server", "threads: 0"},           {"server", "max_body_bytes: 1023"},
      {"server", "max_n: 129"},           {"engine", "max_running: 0"},
      {"server", "max_prompts: 0"},       {"server", "max_prompts: 4097"},
      {"engine", "max_batch_tokens: 0"},  {"engine", "max_waiting: -5"},
      {"engine", "threads: -1"},          {"engine", "threads: 1025"},
      {"kv_cache", "block_size: 0"},      {"kv_cache", "block_size: 1025"},
      {"kv_cache", "memory_mib: 0"},      {"parallel", "tp: 0"},
      {"parallel", "pp: 1025"},           {"engine", "max_running: 99999999999999999999"},
  };
  for (const auto& [section, line] : cases) {
    const std::string path = write("range.yaml", section + ":\n  " + line + "\n");
    const std::string e = load_error(path);
    const std::string key = section + "." + line.substr(0, line.find(':'));
    EXPECT_CONTAINS(e, path);
    EXPECT_CONTAINS(e, key);
  }
  // The bounds themselves are accepted.
  const ServerConfig c = load_server_config(
      write("bounds.yaml", "server:\n  port: 65535\n  threads: 1\n  max_body_bytes: 1024\nkv_cache:\n  block_size: 1024\n"));
  EXPECT_EQ(c.server.port, 65535);
  EXPECT_EQ(c.server.threads, 1);
  EXPECT_EQ(c.server.max_body_bytes, 1024);
  EXPECT_EQ(c.kv_cache.block_size, 1024);
}

TEST_F(ServerConfigTest, BadChoicesNameFileKeyAndTheChoices) {
  {
    const std::string path = write("policy.yaml", "kv_cache:\n  policy: nonsense\n");
    const std::string e = load_error(path);
    EXPECT_CONTAINS(e, path);
    EXPECT_CONTAINS(e, "kv_cache.policy");
    EXPECT_CONTAINS(e, "full");
  }
  {
    const std::string path = write("template.yaml", "model:\n  chat_template: vicuna\n");
    const std::string e = load_error(path);
    EXPECT_CONTAINS(e, path);
    EXPECT_CONTAINS(e, "model.chat_template");
    EXPECT_CONTAINS(e, "chatml");
  }
}

TEST_F(ServerConfigTest, NonMappingSectionNamesFileAndSection) {
  for (const std::string text : {"engine: 5\n", "engine:\n  - max_running\n  - 4\n", "engine:\n"}) {
    const std::string path = write("section.yaml", text);
    const std::string e = load_error(path);
    EXPECT_CONTAINS(e, path);
    EXPECT_CONTAINS(e, "engine");
  }
  const std::string top = write("top.yaml", "- a\n- b\n");
  EXPECT_CONTAINS(load_error(top), top);
}

TEST_F(ServerConfigTest, NonScalarValueNamesFileAndKey) {
  const std::string path = write("nested.yaml", "server:\n  port:\n    value: 80\n");
  const std::string e = load_error(path);
  EXPECT_CONTAINS(e, path);
  EXPECT_CONTAINS(e, "server.port");
  const std::string list = write("list.yaml", "server:\n  host: [a, b]\n");
  const std::string e2 = load_error(list);
  EXPECT_CONTAINS(e2, list);
  EXPECT_CONTAINS(e2, "server.host");
}

TEST_F(ServerConfigTest, MalformedYamlNamesFileAndLine) {
  const std::string path = write("broken.yaml",
                                 "model:\n"
                                 "  path: x.gguf\n"
                                 "engine:\n"
                                 "  max_running: [1, 2\n"  // an unclosed flow sequence
                                 "  max_waiting: 3\n");
  const std::string e = load_error(path);
  EXPECT_CONTAINS(e, path);
  EXPECT_CONTAINS(e, "line ");
  // yaml-cpp reports the error where the flow sequence breaks: on line 4 or 5, never line 1.
  EXPECT_TRUE(e.find("line 4") != std::string::npos || e.find("line 5") != std::string::npos) << e;

  // An error yaml-cpp pins to one line: "illegal map value" on line 5 (1-based, as editors count).
  const std::string map_value = write("map_value.yaml",
                                      "model:\n"
                                      "  path: x.gguf\n"
                                      "engine:\n"
                                      "  max_running: 4\n"
                                      "  bad: value: here\n");
  const std::string e2 = load_error(map_value);
  EXPECT_CONTAINS(e2, map_value);
  EXPECT_CONTAINS(e2, "line 5");

  const std::string tab = write("tab.yaml", "server:\n\tport: 1\n");  // a tab where indentation is expected
  const std::string e3 = load_error(tab);
  EXPECT_CONTAINS(e3, tab);
  EXPECT_CONTAINS(e3, "line 2");
}

TEST_F(ServerConfigTest, MissingFileNamesTheFile) {
  const std::string path = (dir_ / "does-not-exist.yaml").string();
  const std::string e = load_error(path);
  EXPECT_CONTAINS(e, path);
}

TEST_F(ServerConfigTest, OverridesApplyWithTheSameChecks) {
  ServerConfig c = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
  apply_config_override(c, "engine.max_running=3");
  apply_config_override(c, "server.port=0");
  apply_config_override(c, "kv_cache.policy=full");
  apply_config_override(c, "model.system_prompt=a=b");  // only the first '=' separates key and value
  apply_config_override(c, "model.name=");              // an empty string is a string
  apply_config_override(c, "parallel.pp=2");
  EXPECT_EQ(c.engine.max_running, 3);
  EXPECT_EQ(c.server.port, 0);
  EXPECT_EQ(c.model.system_prompt, "a=b");
  EXPECT_EQ(c.model.name, "");
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.engine.max_batch_tokens, 512);  // untouched keys keep the file's values

  const std::string no_eq = override_error(c, "engine.max_running");
  EXPECT_CONTAINS(no_eq, "engine.max_running");
  EXPECT_CONTAINS(no_eq, "--set");
  const std::string unknown = override_error(c, "engine.speed=3");
  EXPECT_CONTAINS(unknown, "engine.speed");
  EXPECT_CONTAINS(unknown, "--set");
  const std::string bad_int = override_error(c, "engine.max_running=many");
  EXPECT_CONTAINS(bad_int, "engine.max_running");
  EXPECT_CONTAINS(bad_int, "'many'");
  const std::string empty_int = override_error(c, "server.port=");
  EXPECT_CONTAINS(empty_int, "server.port");
  const std::string range = override_error(c, "kv_cache.block_size=0");
  EXPECT_CONTAINS(range, "kv_cache.block_size");
  const std::string choice = override_error(c, "kv_cache.policy=none");
  EXPECT_CONTAINS(choice, "kv_cache.policy");
  EXPECT_EQ(c.engine.max_running, 3);  // failed overrides changed nothing
  EXPECT_EQ(c.kv_cache.block_size, 16);
  EXPECT_EQ(c.kv_cache.policy, "full");
}

TEST_F(ServerConfigTest, ConfigKeysListsEveryKey) {
  const std::vector<std::string> keys = config_keys();
  const std::set<std::string> expected = {
      "model.path",          "model.name",           "model.chat_template", "model.system_prompt",
      "model.weight_dtype",  "server.host",         "server.port",          "server.threads",      "server.max_body_bytes",
      "server.max_n",        "server.max_prompts",  "engine.max_running",   "engine.max_batch_tokens", "engine.max_waiting",
      "engine.threads",      "engine.activation_dtype", "engine.cpu_kernels", "engine.backend",       "engine.device",
      "engine.cuda_overlap",
      "kv_cache.block_size", "kv_cache.memory_mib",  "kv_cache.policy",     "kv_cache.layer_overrides",
      "kv_cache.request_policies", "kv_cache.dtype", "kv_cache.pod_blocks", "kv_cache.prefix_caching",
      "kv_cache.prefill_compression", "kv_cache.prefill_chunk", "parallel.tp", "parallel.pp",
      "parallel.timeout_s", "parallel.micro_batches",
      "server.ignore_unknown_fields", "server.access_log",
      "server.max_connections", "server.idle_timeout_s", "server.drain_timeout_s", "server.api_keys",
      "server.api_key_file", "server.metrics_require_key", "router.replicas", "router.policy",
      "router.busy_threshold", "router.index_blocks", "router.health_interval_ms", "router.health_timeout_ms",
      "router.connect_timeout_ms", "router.upstream_timeout_s", "router.forward_api_key",
  };
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()), expected);
  EXPECT_EQ(keys.size(), expected.size());  // no duplicates
  // Every listed key is settable, and the shipped config sets only listed keys.
  ServerConfig c;
  for (const std::string& k : keys) {
    const std::string value = k == "model.chat_template" ? "chatml"
                              : k == "kv_cache.policy"   ? "full"
                              : k == "kv_cache.layer_overrides" ? "0-1=full"
                              : k == "kv_cache.request_policies" ? "full,snapkv"
                              : k == "server.max_body_bytes" ? "2048"
                              : k == "kv_cache.dtype"        ? "int4"
                              : k == "engine.backend"        ? "cpu"
                              : k == "engine.activation_dtype" ? "int8"
                              : k == "engine.cpu_kernels"    ? "baseline"
                              : k == "model.weight_dtype"    ? "q8_0"
                              : k == "kv_cache.prefix_caching" || k == "engine.cuda_overlap" ? "off"
                              : k == "kv_cache.prefill_compression" ? "chunked"
                              : k == "server.ignore_unknown_fields" || k == "server.access_log" ? "true"
                              : k == "server.metrics_require_key" ? "true"
                              : k == "server.api_keys"        ? "sk-a,sk-b"
                              : k == "router.replicas"        ? "http://127.0.0.1:8001,http://[::1]:8002/"
                              : k == "router.policy"          ? "round_robin"
                              : k == "router.forward_api_key" ? "false"
                                                             : "16";
    EXPECT_NO_THROW(apply_config_override(c, k + "=" + value)) << k;
  }
}

TEST_F(ServerConfigTest, KvDtypeIsOneOfTheFormats) {
  ServerConfig c;
  EXPECT_EQ(c.kv_cache.dtype, "f32");
  for (const std::string dtype : {"f32", "f16", "bf16", "int8", "int4", "int2"}) {
    apply_config_override(c, "kv_cache.dtype=" + dtype);
    EXPECT_EQ(c.kv_cache.dtype, dtype);
  }
  const std::string e = override_error(c, "kv_cache.dtype=int3");
  EXPECT_CONTAINS(e, "kv_cache.dtype");
  EXPECT_CONTAINS(e, "int3");
}

TEST_F(ServerConfigTest, CompressionKeysAreCheckedWhereTheyAreRead) {
  ServerConfig c;
  apply_config_override(c, "kv_cache.policy=pyramidkv:budget=128,window=8");
  EXPECT_EQ(c.kv_cache.policy, "pyramidkv:budget=128,window=8");
  for (const std::string bad : {"kv_cache.policy=nosuch", "kv_cache.policy=snapkv:budget=0",
                                "kv_cache.policy=snapkv:colour=red", "kv_cache.layer_overrides=0-1",
                                "kv_cache.layer_overrides=2=snapkv:pool=median", "kv_cache.request_policies=full,nosuch"}) {
    try {
      apply_config_override(c, bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      const std::string key = bad.substr(0, bad.find('='));
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  apply_config_override(c, "kv_cache.request_policies=none");
  EXPECT_TRUE(request_policy_names(c).empty());
  apply_config_override(c, "kv_cache.request_policies=all");
  EXPECT_EQ(request_policy_names(c), policy_names());
  apply_config_override(c, "kv_cache.request_policies= full , snapkv ");
  EXPECT_EQ(request_policy_names(c), (std::vector<std::string>{"full", "snapkv"}));
}

TEST_F(ServerConfigTest, ServerHardeningKeysHaveTheirDefaults) {
  const ServerConfig c = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
  EXPECT_EQ(c.server.max_connections, 512);
  EXPECT_EQ(c.server.idle_timeout_s, 15);
  EXPECT_EQ(c.server.drain_timeout_s, 30);
  EXPECT_TRUE(c.server.api_keys.empty());
  EXPECT_EQ(c.server.api_key_file, "");
  EXPECT_FALSE(c.server.metrics_require_key);
  EXPECT_TRUE(configured_api_keys(c).empty());
}

TEST_F(ServerConfigTest, ApiKeysFromAYamlListAnOverrideAndAFile) {
  const std::string key_file = write("keys.txt", "# team keys\nsk-file-1\n\n  sk-file-2  \n#sk-old\n");
  const std::string path = write("keys.yaml",
                                 "server:\n"
                                 "  api_keys: [sk-yaml-1, \"sk-yaml,2\"]\n"
                                 "  api_key_file: " + key_file + "\n"
                                 "  metrics_require_key: true\n"
                                 "  max_connections: 64\n"
                                 "  idle_timeout_s: 5\n"
                                 "  drain_timeout_s: 0\n");
  ServerConfig c = load_server_config(path);
  EXPECT_EQ(c.server.api_keys, (std::vector<std::string>{"sk-yaml-1", "sk-yaml,2"})) << "a list item may hold a comma";
  EXPECT_EQ(configured_api_keys(c), (std::vector<std::string>{"sk-yaml-1", "sk-yaml,2", "sk-file-1", "sk-file-2"}));
  EXPECT_TRUE(c.server.metrics_require_key);
  EXPECT_EQ(c.server.max_connections, 64);
  EXPECT_EQ(c.server.idle_timeout_s, 5);
  EXPECT_EQ(c.server.drain_timeout_s, 0);
  apply_config_override(c, "server.api_keys=sk-x, sk-y");
  EXPECT_EQ(c.server.api_keys, (std::vector<std::string>{"sk-x", "sk-y"}));
}

TEST_F(ServerConfigTest, BadApiKeysNameTheKeyButNeverShowIt) {
  const std::string spaced = write("spaced.yaml", "server:\n  api_keys: [sk-good, \"sk-secret value\"]\n");
  const std::string e = load_error(spaced);
  EXPECT_CONTAINS(e, "server.api_keys: entry 2");
  EXPECT_EQ(e.find("secret"), std::string::npos) << e;
  const std::string nested = write("nested_keys.yaml", "server:\n  api_keys: [[a]]\n");
  EXPECT_CONTAINS(load_error(nested), "server.api_keys");

  ServerConfig c;
  c.file = "deploy.yaml";
  c.server.api_key_file = (dir_ / "missing.txt").string();
  try {
    configured_api_keys(c);
    ADD_FAILURE() << "a missing key file was accepted";
  } catch (const ConfigError& error) {
    EXPECT_CONTAINS(error.what(), "deploy.yaml: server.api_key_file: cannot read");
  }
  c.server.api_key_file = write("comments.txt", "# only a comment\n\n");
  try {
    configured_api_keys(c);
    ADD_FAILURE() << "a key file without keys was accepted: the server would be open";
  } catch (const ConfigError& error) {
    EXPECT_CONTAINS(error.what(), "server.api_key_file");
    EXPECT_CONTAINS(error.what(), "holds no key");
  }
  c.server.api_key_file = write("bad.txt", "sk-fine\nsk-\x01hidden\n");
  try {
    configured_api_keys(c);
    ADD_FAILURE() << "a key with a control character was accepted";
  } catch (const ConfigError& error) {
    EXPECT_CONTAINS(error.what(), "entry 2");
    EXPECT_EQ(std::string(error.what()).find("hidden"), std::string::npos) << error.what();
  }
}

TEST_F(ServerConfigTest, ConnectionAndDrainKeysAreChecked) {
  ServerConfig c;
  EXPECT_CONTAINS(override_error(c, "server.max_connections=0"), "server.max_connections");
  EXPECT_CONTAINS(override_error(c, "server.idle_timeout_s=0"), "server.idle_timeout_s");
  EXPECT_CONTAINS(override_error(c, "server.drain_timeout_s=-1"), "server.drain_timeout_s");
  EXPECT_CONTAINS(override_error(c, "server.metrics_require_key=yes"), "server.metrics_require_key");
}

TEST_F(ServerConfigTest, RouterSectionFromAYamlListWithItsDefaults) {
  const ServerConfig defaults;
  EXPECT_TRUE(defaults.router.replicas.empty());
  EXPECT_EQ(defaults.router.policy, "cache_aware");
  EXPECT_TRUE(defaults.router.forward_api_key);
  const ServerConfig c = load_server_config(write("router.yaml",
                                                  "router:\n"
                                                  "  replicas: [http://127.0.0.1:8001, \"http://10.0.0.2:8000/\"]\n"
                                                  "  policy: round_robin\n"
                                                  "  busy_threshold: 3\n"
                                                  "  health_interval_ms: 250\n"));
  EXPECT_EQ(c.router.replicas, (std::vector<std::string>{"http://127.0.0.1:8001", "http://10.0.0.2:8000/"}));
  EXPECT_EQ(c.router.policy, "round_robin");
  EXPECT_EQ(c.router.busy_threshold, 3);
  EXPECT_EQ(c.router.health_interval_ms, 250);
}

TEST_F(ServerConfigTest, BadRouterValuesNameTheKeyAndTheReplica) {
  const std::string not_http = load_error(write("scheme.yaml", "router:\n  replicas: [https://a:1]\n"));
  EXPECT_CONTAINS(not_http, "scheme.yaml: router.replicas");
  EXPECT_CONTAINS(not_http, "https://a:1");
  EXPECT_CONTAINS(load_error(write("nested.yaml", "router:\n  replicas: [[http://a:1]]\n")), "expected a list of URLs");
  ServerConfig c;
  EXPECT_CONTAINS(override_error(c, "router.replicas=http://a:99999"), "port '99999'");
  EXPECT_CONTAINS(override_error(c, "router.replicas=http://a:1/v1"), "without a path");
  EXPECT_CONTAINS(override_error(c, "router.policy=random"), "cache_aware, round_robin");
  EXPECT_CONTAINS(override_error(c, "router.health_interval_ms=0"), "router.health_interval_ms");
}

}  // namespace
}  // namespace strata
