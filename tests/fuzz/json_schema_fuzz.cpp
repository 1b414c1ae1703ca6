// libFuzzer harness: the JSON Schema compiler (grammar/json_schema.h, with the regex subset of
// grammar/string_pattern.h and the number ranges of grammar/number_range.h) on arbitrary JSON, then a walk through
// the compiled grammar. The input's first byte seeds the walk; the rest is the schema's text.
// Expected: invalid JSON (skipped) and grammar::SchemaError. Bugs: a crash, a sanitizer report, any other exception,
// and a dead end: a state, reached by bytes the grammar allowed, from which no byte continues and which is not
// complete (the server's decoding would then have no token to choose).
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

// Follows the grammar byte by byte, each step a byte drawn among those it allows, for at most 256 bytes.
void walk(const std::shared_ptr<const strata::grammar::Grammar>& grammar, uint32_t seed) {
  strata::grammar::GrammarMatcher matcher(grammar);
  std::mt19937 rng(seed);
  for (int step = 0; step < 256; ++step) {
    std::vector<uint8_t> allowed;
    for (int byte = 0; byte < 256; ++byte) {
      if (matcher.accepts(std::string(1, char(byte)))) allowed.push_back(uint8_t(byte));
    }
    if (allowed.empty()) {
      if (!matcher.is_complete()) strata::fuzz::fail("a dead end after " + std::to_string(step) + " bytes");
      return;
    }
    if (matcher.is_complete() && rng() % 4 == 0) return;
    matcher.advance(allowed[rng() % allowed.size()]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  nlohmann::ordered_json schema = nlohmann::ordered_json::parse(data + 1, data + size, nullptr, false);
  if (schema.is_discarded()) return 0;
  std::shared_ptr<const strata::grammar::Grammar> grammar;
  try {
    grammar = strata::grammar::compile_json_schema(schema, {strata::grammar::JsonStyle{data[0] % 3u}, "schema"});
  } catch (const strata::grammar::SchemaError&) {
    return 0;
  }
  walk(grammar, data[0]);
  return 0;
}
