// Masks under mask keys (grammar/token_mask.h, GrammarAutomaton::mask_key): at every step of random walks, over
// random schemas and over schemas with long bounded repeats (maxLength, maxItems, digit caps, {n,m}, bounded
// whitespace), the mask equals the reference: every token checked byte by byte against the real state, on an
// automaton of its own (no trie, no key, no cache). On a synthetic vocabulary with tokens longer than the bounds
// and on SmolLM2's. Then the point of the keys: inside a string with maxLength 80 the mask stops costing a walk
// of the whole vocabulary after the first character.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"
#include "tests/grammar/grammar_test_util.h"
#include "tests/grammar/schema_walk.h"
#include "tests/test_paths.h"

namespace strata::grammar {
namespace {

using test::schema_grammar;

// The mask computed the plain way, token by token from the real state: the reference the keyed masks must equal.
TokenMask reference_mask(GrammarAutomaton& automaton, StateId state, const std::vector<std::string>& tokens,
                         const std::vector<int32_t>& end_tokens) {
  TokenMask mask(size_t(mask_words(int64_t(tokens.size()))), 0);
  for (size_t id = 0; id < tokens.size(); ++id) {
    bool allowed = !tokens[id].empty();
    if (std::find(end_tokens.begin(), end_tokens.end(), static_cast<int32_t>(id)) != end_tokens.end()) {
      allowed = automaton.is_complete(state);
    } else {
      StateId next = state;
      for (size_t i = 0; allowed && i < tokens[id].size(); ++i) {
        next = automaton.step(next, static_cast<uint8_t>(tokens[id][i]));
        allowed = next != kDeadState;
      }
    }
    if (allowed) mask_set(mask, int64_t(id));
  }
  return mask;
}

// The first token on which two masks differ, or -1.
int32_t first_difference(const TokenMask& a, const TokenMask& b) {
  for (size_t word = 0; word < a.size(); ++word) {
    if (a[word] != b[word]) return static_cast<int32_t>(word * 64 + __builtin_ctzll(a[word] ^ b[word]));
  }
  return -1;
}

// Schemas whose repeats run long, so that walks meet counts far from and near their bounds.
const std::vector<const char*> kBoundedSchemas = {
    R"({"type": "string", "maxLength": 80})",
    R"({"type": "string", "minLength": 20, "maxLength": 30})",
    R"({"type": "object", "properties": {"items": {"type": "array", "minItems": 8, "maxItems": 8,
      "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
      "note": {"type": "string", "maxLength": 80}}, "required": ["name", "note"]}}}, "required": ["items"]})",
    R"({"type": "array", "minItems": 2, "maxItems": 5,
      "items": {"type": "array", "maxItems": 4, "items": {"type": "integer", "minimum": 0, "maximum": 999}}})",
    R"({"type": "string", "pattern": "^(ab|c){3,40}-[a-z0-9]{2,25}$"})",
    R"({"anyOf": [{"type": "string", "maxLength": 10}, {"type": "string", "minLength": 5, "maxLength": 60}]})",
    R"({"type": "object", "properties": {"n": {"type": "number", "minimum": -1000, "maximum": 1000},
      "s": {"type": "string", "minLength": 30, "maxLength": 50}}, "required": ["n", "s"]})",
};

// A walk picking uniformly among the allowed tokens; every step's mask is checked against the reference.
void check_masks(const std::shared_ptr<const Grammar>& grammar, const std::shared_ptr<const VocabularyTrie>& trie,
                 const std::vector<std::string>& tokens, const std::vector<int32_t>& end_tokens, std::mt19937& rng,
                 int max_steps) {
  TokenMatcher matcher(trie, grammar, end_tokens);
  GrammarAutomaton reference(grammar);
  StateId state = reference.initial();
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    const TokenMask& mask = matcher.allowed_tokens();
    const int32_t differs = first_difference(mask, reference_mask(reference, state, tokens, end_tokens));
    ASSERT_EQ(differs, -1) << "token " << differs << " [" << tokens[differs] << "] is "
                           << (mask_has(mask, differs) ? "" : "not ") << "allowed after [" << text << "]";
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < trie->vocab_size(); ++id) {
      if (mask_has(mask, id)) allowed.push_back(id);
    }
    ASSERT_FALSE(allowed.empty()) << "a dead end after [" << text << "]";
    const int32_t token = allowed[rng() % allowed.size()];
    ASSERT_TRUE(matcher.accept_token(token));
    if (matcher.is_finished()) return;
    for (char byte : tokens[token]) state = reference.step(state, static_cast<uint8_t>(byte));
    text += tokens[token];
  }
}

// The bounded schemas (each with and without bounded whitespace), then random ones from the generator.
void check_schemas(const std::shared_ptr<const VocabularyTrie>& trie, const std::vector<std::string>& tokens,
                   const std::vector<int32_t>& end_tokens, int random_schemas, int walks, int max_steps) {
  std::mt19937 rng(5);
  for (const char* schema : kBoundedSchemas) {
    for (int whitespace : {0, 3}) {
      JsonStyle style;
      style.max_whitespace = whitespace;
      SCOPED_TRACE(std::string(schema) + " with whitespace " + std::to_string(whitespace));
      const std::shared_ptr<const Grammar> grammar = schema_grammar(schema, style);
      for (int w = 0; w < walks; ++w) check_masks(grammar, trie, tokens, end_tokens, rng, max_steps);
    }
  }
  test::SchemaGenerator generator(21);
  for (int s = 0; s < random_schemas; ++s) {
    const test::Schema schema = generator.generate();
    JsonStyle style;
    style.max_whitespace = s % 3 == 0 ? 2 : 0;
    std::shared_ptr<const Grammar> grammar;
    try {
      grammar = compile_json_schema(schema, SchemaOptions{style, ""});
    } catch (const SchemaError&) {
      continue;  // the generator may draw empty bounds
    }
    SCOPED_TRACE(schema.dump());
    for (int w = 0; w < walks; ++w) check_masks(grammar, trie, tokens, end_tokens, rng, max_steps);
  }
}

TEST(MaskKeys, EqualTheReferenceOnASyntheticVocabularyWithLongTokens) {
  const std::vector<std::string> tokens = test::synthetic_vocabulary(8, /*long_tokens=*/true);
  auto trie = std::make_shared<VocabularyTrie>(tokens);
  check_schemas(trie, tokens, {static_cast<int32_t>(tokens.size() - 1)}, 150, 3, 400);
}

TEST(MaskKeys, EqualTheReferenceOnTheRealVocabulary) {
  auto gguf = GgufFile::open(strata::test::smollm2_gguf_path());
  Tokenizer tokenizer = Tokenizer::from_gguf(*gguf);
  const std::vector<std::string> tokens = tokenizer.text_bytes(tokenizer.vocab_size());
  auto trie = std::make_shared<VocabularyTrie>(tokens);
  check_schemas(trie, tokens, tokenizer.stop_ids(), 12, 1, 120);
}

// 256 single bytes, one token longer than the string's bound, the end token.
TEST(MaskKeys, ABoundedStringWalksTheWholeVocabularyOnce) {
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.push_back(std::string(1, char(byte)));
  tokens.push_back(std::string(100, 'a'));
  tokens.push_back("");
  const int32_t end = static_cast<int32_t>(tokens.size() - 1);
  TokenMatcher m(std::make_shared<VocabularyTrie>(tokens), schema_grammar(R"({"type": "string", "maxLength": 80})"),
                 {end});
  ASSERT_TRUE(m.accept_token('"'));
  m.allowed_tokens();
  ASSERT_TRUE(m.accept_token('x'));
  const size_t walks = m.masker().whole_walks();
  for (int count = 1; count < 79; ++count) {
    const TokenMask& mask = m.allowed_tokens();
    EXPECT_TRUE(mask_has(mask, 'x'));
    EXPECT_TRUE(mask_has(mask, '"'));
    EXPECT_FALSE(mask_has(mask, 256)) << "100 bytes do not fit";
    EXPECT_FALSE(mask_has(mask, end));
    ASSERT_TRUE(m.accept_token('x'));
  }
  EXPECT_EQ(m.masker().whole_walks(), walks) << "every count's mask came from the first one's";
}

// Where every token fits in what is left of the bound, the counts share one cached mask outright.
TEST(MaskKeys, ABoundedStringSharesOneMaskWhileTheTokensFit) {
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.push_back(std::string(1, char(byte)));
  tokens.push_back("abcdef");
  tokens.push_back("");
  TokenMatcher m(std::make_shared<VocabularyTrie>(tokens), schema_grammar(R"({"type": "string", "maxLength": 80})"),
                 {static_cast<int32_t>(tokens.size() - 1)});
  ASSERT_TRUE(m.accept_token('"'));
  const size_t masks = m.masker().cached_masks();
  // After k characters the count is k + 1 (the character under way): 6 bytes ahead it stays below 80 up to k = 73.
  for (int k = 0; k <= 73; ++k) {
    EXPECT_TRUE(mask_has(m.allowed_tokens(), 256)) << "six more characters fit";
    ASSERT_TRUE(m.accept_token('x'));
  }
  EXPECT_EQ(m.masker().cached_masks(), masks + 1) << "one mask for the counts 1 to 74";
  EXPECT_TRUE(mask_has(m.allowed_tokens(), 256)) << "74 + 6 = 80";
  ASSERT_TRUE(m.accept_token('x'));
  EXPECT_FALSE(mask_has(m.allowed_tokens(), 256)) << "75 + 6 > 80";
}

}  // namespace
}  // namespace strata::grammar
