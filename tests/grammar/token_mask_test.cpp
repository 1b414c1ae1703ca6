// Token masks over a synthetic vocabulary: tokens that cross terminals, escapes, tokens that end inside a UTF-8
// character, end tokens only when the grammar is complete, the trie's mask against a brute-force check of every
// token, and the mask cache.
#include "grammar/token_mask.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/grammar/grammar_test_util.h"

namespace strata::grammar {
namespace {

using test::schema_grammar;

// Ids 0..255: the single bytes; then multi-byte tokens; then a special token and the end token (no bytes).
struct Vocabulary {
  std::vector<std::string> tokens;
  int32_t special = -1, end = -1;

  Vocabulary() {
    for (int byte = 0; byte < 256; ++byte) tokens.push_back(std::string(1, char(byte)));
    for (const char* token : {"{\"", "\":", "\",\"", "\"}", "{\"a\":", "{\"a\":\"", "\\\"", "\\\\", "\\u", "00e9",
                              "\\u00", "\xE2\x82", "\xC3\xA9", "\xE2\x82\xAC", "ab", "true", "null", "12", "3.",
                              ".5", "]}", "\"],\"", "\"b\":[", "1,", "\"x\"", "\"\"", "[]", "{}", "a\"", "e9\""}) {
      tokens.push_back(token);
    }
    special = static_cast<int32_t>(tokens.size());
    tokens.push_back("");
    end = static_cast<int32_t>(tokens.size());
    tokens.push_back("");
  }
  int32_t id(const std::string& token) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == token) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token " << token;
    return -1;
  }
};

std::vector<int32_t> allowed_ids(const TokenMask& mask, int32_t vocab_size) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (mask_has(mask, id)) ids.push_back(id);
  }
  return ids;
}

class TokenMaskTest : public ::testing::Test {
 protected:
  TokenMatcher matcher(const char* schema) {
    return TokenMatcher(trie_, schema_grammar(schema), {vocab_.end});
  }
  bool allowed(TokenMatcher& m, const std::string& token) { return mask_has(m.allowed_tokens(), vocab_.id(token)); }
  void accept(TokenMatcher& m, const std::string& token) {
    ASSERT_TRUE(allowed(m, token)) << token;
    ASSERT_TRUE(m.accept_token(vocab_.id(token))) << token;
  }

  Vocabulary vocab_;
  std::shared_ptr<const VocabularyTrie> trie_ = std::make_shared<VocabularyTrie>(vocab_.tokens);
};

TEST_F(TokenMaskTest, TokensCrossTerminalBoundaries) {
  TokenMatcher m = matcher(R"({"properties": {"a": {"type": "string"}, "b": {"type": "array"}}, "required": ["a"]})");
  std::vector<int32_t> first = allowed_ids(m.allowed_tokens(), trie_->vocab_size());
  EXPECT_EQ(first, (std::vector<int32_t>{'{', vocab_.id("{\""), vocab_.id("{\"a\":"), vocab_.id("{\"a\":\"")}));
  accept(m, "{\"a\":\"");
  EXPECT_TRUE(allowed(m, "ab"));
  EXPECT_TRUE(allowed(m, "\"}")) << "an empty string, and the object ends (b is optional)";
  EXPECT_FALSE(allowed(m, "\"x\"")) << "after the string comes , or }";
  accept(m, "ab");
  EXPECT_TRUE(allowed(m, "\"}"));
  EXPECT_TRUE(allowed(m, "\",\""));
  EXPECT_FALSE(allowed(m, "\"],\""));
  accept(m, "\",\"");
  EXPECT_TRUE(allowed(m, "b"));
  EXPECT_FALSE(allowed(m, "a")) << "a came already; only b is left";
  accept(m, "b");
  accept(m, "\":");
  accept(m, "[]");
  EXPECT_FALSE(m.is_complete());
  EXPECT_FALSE(mask_has(m.allowed_tokens(), vocab_.end));
  accept(m, "}");
  EXPECT_TRUE(m.is_complete());
  EXPECT_EQ(allowed_ids(m.allowed_tokens(), trie_->vocab_size()), std::vector<int32_t>{vocab_.end});
  EXPECT_TRUE(m.accept_token(vocab_.end));
  EXPECT_TRUE(m.is_finished());
  EXPECT_FALSE(m.accept_token('x'));
}

TEST_F(TokenMaskTest, TokensEndingInsideAUtf8Character) {
  TokenMatcher m = matcher(R"({"type": "string"})");
  accept(m, "\"");
  EXPECT_TRUE(allowed(m, "\xE2\x82"));
  EXPECT_TRUE(allowed(m, "\xE2\x82\xAC"));
  EXPECT_FALSE(allowed(m, std::string(1, char(0x82)))) << "a continuation byte cannot start a character";
  accept(m, "\xE2\x82");
  std::vector<int32_t> next = allowed_ids(m.allowed_tokens(), trie_->vocab_size());
  ASSERT_EQ(next.size(), 64u) << "only the 64 continuation bytes";
  EXPECT_EQ(next.front(), 0x80);
  EXPECT_EQ(next.back(), 0xBF);
  accept(m, "\xAC");
  accept(m, "\xC3\xA9");
  accept(m, "\"");
  EXPECT_TRUE(m.is_complete());
  // After E0 only A0..BF continue (no overlong forms); after ED only 80..9F (no surrogates).
  TokenMatcher e0 = matcher(R"({"type": "string"})");
  accept(e0, "\"");
  accept(e0, "\xE0");
  EXPECT_EQ(allowed_ids(e0.allowed_tokens(), trie_->vocab_size()).front(), 0xA0);
  TokenMatcher ed = matcher(R"({"type": "string"})");
  accept(ed, "\"");
  accept(ed, "\xED");
  EXPECT_EQ(allowed_ids(ed.allowed_tokens(), trie_->vocab_size()).back(), 0x9F);
}

TEST_F(TokenMaskTest, Escapes) {
  TokenMatcher m = matcher(R"({"type": "string", "maxLength": 3})");
  accept(m, "\"");
  accept(m, "\\\"");
  accept(m, "\\u");
  EXPECT_TRUE(allowed(m, "00e9"));
  EXPECT_TRUE(allowed(m, "ab")) << "a token may stop inside \\uXXXX";
  EXPECT_FALSE(allowed(m, "null")) << "n is no hex digit";
  accept(m, "00e9");
  accept(m, "\\\\");
  EXPECT_FALSE(allowed(m, "a")) << "three characters already";
  EXPECT_FALSE(allowed(m, "a\""));
  accept(m, "\"");
  EXPECT_TRUE(m.is_complete());
}

TEST_F(TokenMaskTest, SpecialTokensWithoutBytesAreNeverAllowed) {
  TokenMatcher m = matcher(R"({"type": "string"})");
  accept(m, "\"");
  EXPECT_FALSE(mask_has(m.allowed_tokens(), vocab_.special));
  EXPECT_FALSE(m.accept_token(vocab_.special));
  EXPECT_FALSE(m.accept_token(-1));
  EXPECT_FALSE(m.accept_token(trie_->vocab_size()));
}

TEST_F(TokenMaskTest, MaskEqualsTokenByTokenCheck) {
  auto grammar = schema_grammar(R"({"type": "object", "properties": {
      "a": {"type": "string", "pattern": "^[a-c]+\u00e9?$"}, "n": {"type": "number", "minimum": -2.5, "maximum": 31},
      "l": {"type": "array", "items": {"enum": ["x", 12, true]}, "maxItems": 3}}, "required": ["a", "n"]})");
  std::mt19937 rng(11);
  for (int walk = 0; walk < 30; ++walk) {
    TokenMatcher m(trie_, grammar, {vocab_.end});
    GrammarMatcher reference(grammar);  // its own automaton: an independent check
    for (int step = 0; step < 60 && !m.is_finished(); ++step) {
      const TokenMask& mask = m.allowed_tokens();
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < trie_->vocab_size(); ++id) {
        bool expected = id == vocab_.end ? reference.is_complete()
                                         : !vocab_.tokens[id].empty() && reference.accepts(vocab_.tokens[id]);
        ASSERT_EQ(mask_has(mask, id), expected) << "token " << id << " at step " << step;
        if (expected) ids.push_back(id);
      }
      ASSERT_FALSE(ids.empty()) << "a dead end";
      int32_t chosen = ids[rng() % ids.size()];
      ASSERT_TRUE(m.accept_token(chosen));
      if (chosen != vocab_.end) {
        ASSERT_TRUE(reference.advance(vocab_.tokens[chosen]));
      }
    }
  }
}

TEST_F(TokenMaskTest, MasksAreCachedByState) {
  TokenMatcher m = matcher(R"({"type": "array", "items": {"type": "string"}})");
  for (const char* token : {"[", "\"", "ab"}) ASSERT_TRUE(m.accept_token(vocab_.id(token)));
  EXPECT_EQ(m.masker().cached_masks(), 0u);
  const TokenMask* inside_string = &m.allowed_tokens();
  EXPECT_EQ(m.masker().cached_masks(), 1u);
  ASSERT_TRUE(m.accept_token(vocab_.id("ab")));  // the same state inside a free string
  EXPECT_EQ(&m.allowed_tokens(), inside_string);
  EXPECT_EQ(m.masker().cached_masks(), 1u);
  // The second and third items' strings are in the same state (the first item's is not: it has no comma).
  for (const char* token : {"\",\"", "ab"}) ASSERT_TRUE(m.accept_token(vocab_.id(token)));
  const TokenMask* second_item = &m.allowed_tokens();
  EXPECT_EQ(m.masker().cached_masks(), 2u);
  for (const char* token : {"\",\"", "ab", "ab"}) ASSERT_TRUE(m.accept_token(vocab_.id(token)));
  EXPECT_EQ(&m.allowed_tokens(), second_item);
  EXPECT_EQ(m.masker().cached_masks(), 2u);
}

}  // namespace
}  // namespace strata::grammar
