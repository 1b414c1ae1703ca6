// Patterns: the supported subset against std::regex (ECMAScript) on ASCII texts, JSON escaping of the matched
// characters, Unicode classes, anchoring, and the refused constructs.
#include "grammar/string_pattern.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/grammar/grammar_test_util.h"

namespace strata::grammar {
namespace {

using test::matches;
using test::schema_error;
using test::schema_grammar;

std::shared_ptr<const Grammar> pattern_grammar(const std::string& pattern) {
  return schema_grammar(nlohmann::json{{"type", "string"}, {"pattern", pattern}}.dump());
}

// The JSON string literal of `text` (nlohmann's escaping: the canonical spelling the grammar generates).
std::string quoted(const std::string& text) { return nlohmann::json(text).dump(); }

TEST(StringPattern, AgreesWithStdRegexOnAsciiTexts) {
  const std::vector<std::string> patterns = {
      "^[a-z]+$",        "^\\d{3}-\\d{4}$", "^(ab|cd)*e?$",  "abc",           "^a.c$",         "^[^0-9]{2,3}$",
      "^(?:x|yz){1,2}$", "^\\w+@\\w+\\.com$", "^[A-Fa-f0-9]{2}$", "b+$",       "^a",            "^\\s*\\S+$",
      "^[-+]?[0-9]+(\\.[0-9]+)?$", "^a{2,}$", "^(a|b)c$",       "^[a\\-z]$",     "^\\(\\)\\[\\]$", "^a*?b$"};
  const std::vector<std::string> texts = {
      "",      "a",     "abc",     "ABC",      "123-4567", "12-34567", "abcde",  "cdab",   "e",     "abab e",
      "a.c",   "abc",   "a\nc",    "xyz",      "xyzyz",    "x",        "yzyz",   "me@site.com", "m@s.org", "ff",
      "0G",    "bbb",   "abb",     "  word",   "two words", "+12.5",   "-3",     "1.",     "aa",    "aaa",
      "ac",    "bc",    "cc",      "-",        "z",        "()[]",     "aab",    "b",      "zzabczz", "\tq"};
  for (const std::string& pattern : patterns) {
    auto grammar = pattern_grammar(pattern);
    std::regex regex(pattern, std::regex::ECMAScript);
    for (const std::string& text : texts) {
      EXPECT_EQ(matches(grammar, quoted(text)), std::regex_search(text, regex)) << pattern << " on " << quoted(text);
    }
  }
}

TEST(StringPattern, SpecialCharactersAreEscapedOneWay) {
  auto quote = pattern_grammar("^a\"b\\\\c$");  // the characters a " b \ c
  EXPECT_TRUE(matches(quote, R"("a\"b\\c")"));
  EXPECT_FALSE(matches(quote, R"("a\u0022b\\c")")) << "one spelling per character";
  auto newline = pattern_grammar("^x\\ny\\t$");
  EXPECT_TRUE(matches(newline, R"("x\ny\t")"));
  auto control = pattern_grammar("^[\\x00-\\x1f]$");
  EXPECT_TRUE(matches(control, R"("\u0001")"));
  EXPECT_TRUE(matches(control, R"("\n")"));
  EXPECT_FALSE(matches(control, R"(" ")"));
  auto any = pattern_grammar("^.$");
  EXPECT_TRUE(matches(any, R"("\"")"));
  EXPECT_FALSE(matches(any, R"("\n")")) << ". does not match a line terminator";
}

TEST(StringPattern, UnicodeClasses) {
  auto greek = pattern_grammar("^[α-ω]+$");
  EXPECT_TRUE(matches(greek, quoted("αβγ")));
  EXPECT_FALSE(matches(greek, quoted("abc")));
  auto not_ascii = pattern_grammar("^[^\\x00-\\x7f]{2}$");
  EXPECT_TRUE(matches(not_ascii, quoted("é€")));
  EXPECT_TRUE(matches(not_ascii, quoted("😀ж")));
  EXPECT_FALSE(matches(not_ascii, quoted("éa")));
  auto emoji = pattern_grammar("^\\u00e9😀$");
  EXPECT_TRUE(matches(emoji, quoted("é😀")));
  auto dot = pattern_grammar("^.{3}$");
  EXPECT_TRUE(matches(dot, quoted("a€😀")));
  EXPECT_FALSE(matches(dot, quoted("a€")));
}

TEST(StringPattern, UnanchoredAllowsAnythingAround) {
  auto grammar = pattern_grammar("[0-9]{2}");
  EXPECT_TRUE(matches(grammar, R"("ab12cd")"));
  EXPECT_TRUE(matches(grammar, R"("\u00e9\"12")"));
  EXPECT_FALSE(matches(grammar, R"("a1b2")"));
}

TEST(StringPattern, RefusedConstructs) {
  auto error = [](const std::string& pattern) {
    return schema_error(nlohmann::json{{"type", "string"}, {"pattern", pattern}}.dump());
  };
  EXPECT_NE(error("(?=a)b").find("lookaround"), std::string::npos);
  EXPECT_NE(error("(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(error("\\bword").find("word boundaries"), std::string::npos);
  EXPECT_NE(error("(a*)*").find("empty string"), std::string::npos);
  EXPECT_NE(error("a{2").find("quantifier"), std::string::npos);
  EXPECT_NE(error("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(error("^a|b$").find("top-level"), std::string::npos);
  EXPECT_NE(error("a$b").find("'$' only at the end"), std::string::npos);
  EXPECT_NE(error("[]").find("matches nothing"), std::string::npos);
  EXPECT_NE(error("(ab").find("without its ')'"), std::string::npos);
  EXPECT_NE(error("ab)").find("unbalanced"), std::string::npos);
  EXPECT_NE(error("\\q").find("unsupported escape"), std::string::npos);
  EXPECT_NE(error("a{5,2}").find("m < n"), std::string::npos);
  EXPECT_NE(error("a{1001}").find("above 1000"), std::string::npos);
  EXPECT_EQ(schema_error(R"({"type": "string", "pattern": "^a$", "maxLength": 3})"),
            "/maxLength: cannot be combined with pattern");
  EXPECT_EQ(error("(a*)?b"), "") << "? on something nullable is the thing itself";
}

}  // namespace
}  // namespace strata::grammar
