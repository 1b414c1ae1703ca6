// The property test: for random schemas (seeded), random walks that pick uniformly among the allowed tokens
// always meet a non-empty mask, end with an end token, and produce text that parses and validates against the
// schema. Over a synthetic vocabulary (single bytes plus fragments that split JSON tokens and UTF-8
// characters) and over SmolLM2's real one.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"
#include "tests/grammar/schema_walk.h"
#include "tests/test_paths.h"

namespace strata::grammar {
namespace {

using test::random_walk;
using test::SchemaGenerator;
using test::synthetic_vocabulary;
using test::validate;

void check_walks(const std::shared_ptr<const VocabularyTrie>& trie, const std::vector<std::string>& tokens,
                 std::vector<int32_t> end_tokens, int schemas, int walks_per_schema, int max_steps, uint32_t seed) {
  SchemaGenerator generator(seed);
  std::mt19937 rng(seed + 1);
  int finished = 0, total = 0;
  for (int s = 0; s < schemas; ++s) {
    test::Schema schema = generator.generate();
    JsonStyle style;
    style.max_whitespace = s % 3 == 0 ? 2 : 0;
    std::shared_ptr<const Grammar> grammar;
    try {
      grammar = compile_json_schema(schema, SchemaOptions{style, ""});
    } catch (const SchemaError& error) {
      continue;  // the generator may draw empty bounds (say an exclusive range with no integer in it)
    }
    for (int w = 0; w < walks_per_schema; ++w) {
      TokenMatcher matcher(trie, grammar, end_tokens);
      test::Walk walk = random_walk(matcher, tokens, rng, max_steps);
      ++total;
      ASSERT_FALSE(walk.dead_end) << "an empty mask after " << walk.text << "\nschema " << schema.dump();
      if (!walk.finished) continue;
      ++finished;
      nlohmann::json value;
      ASSERT_NO_THROW(value = nlohmann::json::parse(walk.text)) << walk.text << "\nschema " << schema.dump();
      EXPECT_TRUE(validate(value, schema)) << walk.text << "\nschema " << schema.dump();
    }
  }
  EXPECT_GE(finished * 10, total * 9) << finished << " of " << total << " walks ended within " << max_steps;
}

TEST(RandomWalk, SyntheticVocabulary) {
  std::vector<std::string> tokens = synthetic_vocabulary(3);
  auto trie = std::make_shared<VocabularyTrie>(tokens);
  check_walks(trie, tokens, {static_cast<int32_t>(tokens.size() - 1)}, 250, 4, 3000, 1234);
}

TEST(RandomWalk, AnyJsonObject) {
  std::vector<std::string> tokens = synthetic_vocabulary(5);
  auto trie = std::make_shared<VocabularyTrie>(tokens);
  std::mt19937 rng(99);
  auto grammar = any_json_object_grammar();
  for (int w = 0; w < 100; ++w) {
    TokenMatcher matcher(trie, grammar, {static_cast<int32_t>(tokens.size() - 1)});
    test::Walk walk = random_walk(matcher, tokens, rng, 3000);
    ASSERT_FALSE(walk.dead_end) << walk.text;
    if (!walk.finished) continue;
    nlohmann::json value;
    ASSERT_NO_THROW(value = nlohmann::json::parse(walk.text)) << walk.text;
    EXPECT_TRUE(value.is_object()) << walk.text;
  }
}

// SmolLM2's vocabulary: Tokenizer::text_bytes gives each token's raw bytes, none for special tokens, and
// the tokenizer's stop ids end generation.
TEST(RandomWalk, RealVocabulary) {
  auto gguf = GgufFile::open(strata::test::smollm2_gguf_path());
  Tokenizer tokenizer = Tokenizer::from_gguf(*gguf);
  const std::vector<std::string> tokens = tokenizer.text_bytes(tokenizer.vocab_size());
  auto trie = std::make_shared<VocabularyTrie>(tokens);
  check_walks(trie, tokens, tokenizer.stop_ids(), 40, 2, 2000, 77);
}

}  // namespace
}  // namespace strata::grammar
