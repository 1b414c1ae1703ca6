// libFuzzer harness: a deployment's YAML configuration of arbitrary bytes (daemon/server_config.h), then what the
// daemon derives from an accepted one: the KV policy and its per-layer overrides, the policies requests may choose.
// Expected: ConfigError naming the file and the key. Bugs: any other exception (an error that names neither), a
// crash, a sanitizer report, or a configuration accepted whose policies the daemon cannot parse.
#include <cstddef>
#include <cstdint>

#include "cache/compression_config.h"
#include "cache/policy_spec.h"
#include "daemon/server_config.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void check_policies(const strata::ServerConfig& config) {
  try {
    const strata::PolicySpec policy = strata::parse_policy_spec(config.kv_cache.policy);
    if (strata::parse_policy_spec(strata::to_string(policy)) != policy) {
      strata::fuzz::fail("kv_cache.policy does not survive its canonical text form");
    }
    strata::parse_layer_overrides(config.kv_cache.layer_overrides);
  } catch (const strata::PolicyError& e) {
    strata::fuzz::fail(std::string("an accepted configuration's policies do not parse: ") + e.what());
  }
  strata::request_policy_names(config);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const strata::fuzz::MemoryFile input(data, size);
  strata::ServerConfig config;
  try {
    config = strata::load_server_config(input.path());
  } catch (const strata::ConfigError&) {
    return 0;
  }
  check_policies(config);
  return 0;
}
