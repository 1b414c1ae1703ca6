// What structured output costs before and between decode steps, on SmolLM2's vocabulary: building the vocabulary
// trie (once per server), compiling a schema (once per request), and computing a step's token mask (once per
// constrained row and step, the first time its parser state is met; grammar/token_mask.h caches it).
//
//   build/bench/schema_compile [--reps 20] [--steps 200] [--out bench/results/cpu-schema-compile.json]
//
// Per schema: the median of --reps compilations; then --reps walks of --steps tokens, each token drawn at random
// among those the mask allows (a fresh matcher per walk, so every walk starts with an empty mask cache), timing
// every allowed_tokens() call. Single-threaded, as the engine thread computes masks.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/build_commit.h"
#include "daemon/commands/machine_info.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double mean(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / double(values.size());
}

const std::vector<std::pair<std::string, std::string>> kSchemas = {
    {"json_object", R"({"type": "object"})"},
    {"person", R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
      "age": {"type": "integer", "minimum": 0, "maximum": 120},
      "address": {"type": "object", "properties": {"city": {"type": "string"},
                  "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"]},
      "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}, "required": ["name", "age"]})"},
    {"list_of_8", R"({"type": "object", "properties": {"items": {"type": "array", "minItems": 8, "maxItems": 8,
      "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
      "note": {"type": "string", "maxLength": 80}}, "required": ["name", "note"]}}}, "required": ["items"]})"},
    {"tool_call_anyof_4", R"({"anyOf": [
      {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object",
       "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
       "required": ["city", "unit"]}}, "required": ["name", "arguments"]},
      {"type": "object", "properties": {"name": {"const": "get_time"}, "arguments": {"type": "object",
       "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}}, "required": ["zone"]}},
       "required": ["name", "arguments"]},
      {"type": "object", "properties": {"name": {"const": "search"}, "arguments": {"type": "object",
       "properties": {"query": {"type": "string", "maxLength": 100}, "limit": {"type": "integer", "minimum": 1,
       "maximum": 50}}, "required": ["query"]}}, "required": ["name", "arguments"]},
      {"type": "object", "properties": {"name": {"const": "convert"}, "arguments": {"type": "object",
       "properties": {"amount": {"type": "number", "minimum": 0, "maximum": 1000000}, "from": {"type": "string",
       "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["amount", "from",
       "to"]}}, "required": ["name", "arguments"]}]})"},
};

// The bytes a mask takes in a step plan (parallel/step_plan.cpp): the shortest of the bitset, the allowed ids and
// the refused ids, with the form's tag and counts.
int64_t mask_wire_bytes(size_t n_words, int64_t n_allowed) {
  const int64_t n_bits = int64_t(n_words) * 64;
  return 1 + 4 + std::min(int64_t(n_words) * 8, 4 + 4 * std::min(n_allowed, n_bits - n_allowed));
}

nlohmann::json time_schema(const std::string& text, const std::shared_ptr<const grammar::VocabularyTrie>& trie,
                           const std::vector<int32_t>& stop_ids, int reps, int steps) {
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text);
  std::vector<double> compile_s;
  std::shared_ptr<const grammar::Grammar> compiled;
  for (int r = 0; r < reps; ++r) {
    const Clock::time_point start = Clock::now();
    compiled = grammar::compile_json_schema(schema);
    compile_s.push_back(seconds_since(start));
  }
  std::vector<double> mask_s, first_mask_s, wire_bytes;
  std::mt19937 rng(1);
  for (int r = 0; r < reps; ++r) {
    grammar::TokenMatcher matcher(trie, compiled, stop_ids);
    for (int step = 0; step < steps && !matcher.is_finished(); ++step) {
      const Clock::time_point start = Clock::now();
      const grammar::TokenMask& mask = matcher.allowed_tokens();
      (step == 0 ? first_mask_s : mask_s).push_back(seconds_since(start));
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < trie->vocab_size(); ++id) {
        if (mask_has(mask, id)) allowed.push_back(id);
      }
      wire_bytes.push_back(double(mask_wire_bytes(mask.size(), int64_t(allowed.size()))));
      matcher.accept_token(allowed[rng() % allowed.size()]);
    }
  }
  return {{"compile_ms_median", median(compile_s) * 1e3}, {"first_mask_ms_median", median(first_mask_s) * 1e3},
          {"mask_ms_median", median(mask_s) * 1e3}, {"mask_ms_mean", mean(mask_s) * 1e3},
          {"mask_ms_max", mask_s.empty() ? 0.0 : *std::max_element(mask_s.begin(), mask_s.end()) * 1e3},
          {"masks_timed", mask_s.size()}, {"mask_wire_bytes_mean", mean(wire_bytes)},
          {"mask_bitset_bytes", trie->vocab_size() / 64 * 8}};
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, steps = 200;
  std::string out_path = "bench/results/cpu-schema-compile.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::stoi(argv[i + 1]);
    else if (std::string(argv[i]) == "--steps") steps = std::stoi(argv[i + 1]);
    else if (std::string(argv[i]) == "--out") out_path = argv[i + 1];
  }
  auto gguf = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  const Tokenizer tokenizer = Tokenizer::from_gguf(*gguf);
  const std::vector<std::string> bytes = tokenizer.text_bytes(tokenizer.vocab_size());
  const Clock::time_point start = Clock::now();
  const auto trie = std::make_shared<const grammar::VocabularyTrie>(bytes);
  const double trie_s = seconds_since(start);
  nlohmann::json schemas;
  for (const auto& [name, text] : kSchemas) {
    schemas[name] = time_schema(text, trie, tokenizer.stop_ids(), reps, steps);
    std::cout << name << ": " << schemas[name].dump() << "\n";
  }
  std::string command = "build/bench/schema_compile";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  const nlohmann::json report = {{"what", "schema compilation and token mask times on SmolLM2's vocabulary"},
                                 {"command", command},
                                 {"commit", build_commit()}, {"machine", machine_json()}, {"vocabulary", bytes.size()},
                                 {"trie_build_ms", trie_s * 1e3}, {"trie_nodes", trie->node_count()},
                                 {"reps", reps}, {"steps", steps}, {"schemas", schemas}};
  std::ofstream(out_path) << report.dump(1) << "\n";
  std::cout << "trie: " << trie_s * 1e3 << " ms; wrote " << out_path << "\n";
  return 0;
}
