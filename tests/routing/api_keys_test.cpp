#include "routing/api_keys.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(ApiKeys, AcceptsOnlyAConfiguredBearerKey) {
  const ApiKeys keys({"sk-first", "sk-second-longer"});
  EXPECT_TRUE(keys.accepts("Bearer sk-first"));
  EXPECT_TRUE(keys.accepts("Bearer sk-second-longer"));
  EXPECT_TRUE(keys.accepts("bearer sk-first")) << "the scheme is case-insensitive (RFC 7235)";
  EXPECT_TRUE(keys.accepts("  Bearer   sk-first  ")) << "surrounding whitespace is not part of the key";
  EXPECT_FALSE(keys.accepts("Bearer sk-firs")) << "a prefix of a key";
  EXPECT_FALSE(keys.accepts("Bearer sk-first0")) << "a key with a byte more";
  EXPECT_FALSE(keys.accepts("Bearer SK-FIRST")) << "keys are case-sensitive";
  EXPECT_FALSE(keys.accepts("Bearer sk-second"));
  EXPECT_FALSE(keys.accepts("sk-first")) << "no scheme";
  EXPECT_FALSE(keys.accepts("Basic sk-first"));
  EXPECT_FALSE(keys.accepts("Bearer "));
  EXPECT_FALSE(keys.accepts(""));
  EXPECT_FALSE(keys.accepts(std::string("Bearer sk-first\0x", 17))) << "bytes after a NUL still count";
}

TEST(ApiKeys, NoKeysAcceptNothingButSayEmpty) {
  const ApiKeys keys;
  EXPECT_TRUE(keys.empty());
  EXPECT_FALSE(keys.accepts("Bearer anything"));  // the server does not ask when empty()
}

TEST(ApiKeys, KeyFileLines) {
  const std::string text = "# production keys\nsk-one\n\n   \n  sk-two  \r\n#sk-commented\nsk-three";
  EXPECT_EQ(parse_api_key_lines(text), (std::vector<std::string>{"sk-one", "sk-two", "sk-three"}));
  EXPECT_TRUE(parse_api_key_lines("# nothing\n\n").empty());
  EXPECT_TRUE(parse_api_key_lines("").empty());
}

TEST(ApiKeys, UnusableKeysAreNamedWithoutShowingThem) {
  EXPECT_EQ(api_key_problem("sk-ok_0123"), "");
  EXPECT_NE(api_key_problem(""), "");
  const std::string with_space = api_key_problem("sk-secret part");
  EXPECT_NE(with_space, "");
  EXPECT_EQ(with_space.find("secret"), std::string::npos) << with_space;
  EXPECT_NE(api_key_problem("sk-\x01"), "");
}

TEST(ApiKeys, LoopbackHosts) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.8.9.10"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("::"));
  EXPECT_FALSE(is_loopback_host("10.1.2.3"));
  EXPECT_FALSE(is_loopback_host("example.com"));
}

}  // namespace
}  // namespace strata
