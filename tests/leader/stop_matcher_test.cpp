#include "leader/stop_matcher.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

// Feeds the pieces in order and returns what came out of each push (a stop ends the list).
std::vector<std::string> emitted(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& piece : pieces) {
    StopScan scan = matcher.push(piece);
    out.push_back(scan.text);
    if (scan.stopped) break;
  }
  return out;
}

struct Outcome {
  std::string text;  // everything returned, flush included
  int stop_index = -1;
};

Outcome run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher matcher(stops);
  Outcome outcome;
  for (const std::string& piece : pieces) {
    StopScan scan = matcher.push(piece);
    outcome.text += scan.text;
    if (scan.stopped) {
      outcome.stop_index = scan.stop_index;
      return outcome;
    }
  }
  outcome.text += matcher.flush();
  return outcome;
}

// The definition, byte by byte: the first prefix of the text that ends with a stop string (the longest one, if
// several end there) is where generation stops.
Outcome reference(const std::vector<std::string>& stops, const std::string& text) {
  for (size_t end = 1; end <= text.size(); ++end) {
    std::string_view prefix(text.data(), end);
    int best = -1;
    for (size_t i = 0; i < stops.size(); ++i) {
      if (!stops[i].empty() && prefix.ends_with(stops[i]) &&
          (best < 0 || stops[i].size() > stops[best].size())) {
        best = static_cast<int>(i);
      }
    }
    if (best >= 0) return {std::string(prefix.substr(0, end - stops[best].size())), best};
  }
  return {text, -1};
}

TEST(StopMatcherTest, NoStopsPassesPiecesThrough) {
  StopMatcher matcher({});
  EXPECT_EQ(emitted(matcher, {"Hello", ", wor", "ld"}), (std::vector<std::string>{"Hello", ", wor", "ld"}));
  EXPECT_EQ(matcher.flush(), "");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, StopSplitAcrossManyPieces) {
  StopMatcher matcher({"<|end|>"});
  EXPECT_EQ(emitted(matcher, {"Hello <", "|", "en", "d", "|> never seen"}),
            (std::vector<std::string>{"Hello ", "", "", "", ""}));
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopMatcherTest, TextBeforeTheStopInTheSamePieceIsReturned) {
  StopMatcher matcher({"\n\nUser:"});
  EXPECT_EQ(emitted(matcher, {"The answer", " is 4.\n", "\n\nUser: next"}),
            (std::vector<std::string>{"The answer", " is 4.", "\n"}));
  EXPECT_TRUE(matcher.stopped());
}

TEST(StopMatcherTest, OverlappingPrefixes) {
  // "aba" + "a" is no match, but its last "a" may still start one.
  StopMatcher matcher({"abab"});
  EXPECT_EQ(emitted(matcher, {"a", "b", "a", "a", "b", "a", "b"}),
            (std::vector<std::string>{"", "", "", "aba", "", "", ""}));
  EXPECT_TRUE(matcher.stopped());

  Outcome outcome = run({"abab"}, {"ababab"});
  EXPECT_EQ(outcome.text, "");
  EXPECT_EQ(outcome.stop_index, 0);
}

TEST(StopMatcherTest, EarliestCompletedStopWins) {
  // "lo w" is complete at byte 7, "world" only at 11; the order of the list does not matter.
  Outcome outcome = run({"world", "lo w"}, {"hello world"});
  EXPECT_EQ(outcome.text, "hel");
  EXPECT_EQ(outcome.stop_index, 1);
  // Both end at the same byte: the longer one, which starts earlier.
  outcome = run({"bc", "abc"}, {"xab", "cd"});
  EXPECT_EQ(outcome.text, "x");
  EXPECT_EQ(outcome.stop_index, 1);
}

TEST(StopMatcherTest, MultiByteText) {
  StopMatcher matcher({"。", "終わり"});
  EXPECT_EQ(emitted(matcher, {"日本語", "です", "。次"}), (std::vector<std::string>{"日本語", "です", ""}));
  EXPECT_EQ(matcher.push("無視").stop_index, -1);  // after a stop nothing more is scanned
  EXPECT_TRUE(matcher.stopped());

  // "終" and "終わ" may start "終わり"; "終わら" cannot, and is released whole.
  StopMatcher held({"終わり"});
  EXPECT_EQ(emitted(held, {"これで終", "わ", "らない"}), (std::vector<std::string>{"これで", "", "終わらない"}));
  // "é" (C3 A9) shares its first byte with "è" (C3 A8) but is no prefix of "è!": nothing is held.
  StopMatcher near({"è!"});
  EXPECT_EQ(near.push("café").text, "café");
}

TEST(StopMatcherTest, FalseStartIsReleased) {
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(emitted(matcher, {"go ST", "ART now"}), (std::vector<std::string>{"go ", "START now"}));
  EXPECT_EQ(matcher.push("ST").text, "");
  EXPECT_EQ(matcher.flush(), "ST");  // the end came first: the held text is the client's after all
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  Outcome outcome = run({"", "!"}, {"hi", "!"});
  EXPECT_EQ(outcome.text, "hi");
  EXPECT_EQ(outcome.stop_index, 1);
}

TEST(StopMatcherTest, AnySplitGivesTheDefinedResult) {
  const std::vector<std::string> stops = {"abab", "bba", "aab", "bab", "c"};  // "bab" ends "abab"
  std::mt19937 rng(17);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    for (int i = 0; i < 12; ++i) text += "aabbc"[rng() % (trial % 2 ? 4 : 5)];  // odd trials: no "c"
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      size_t size = 1 + rng() % 4;
      pieces.push_back(text.substr(at, size));
      at += size;
    }
    Outcome want = reference(stops, text);
    Outcome got = run(stops, pieces);
    ASSERT_EQ(got.text, want.text) << text;
    ASSERT_EQ(got.stop_index, want.stop_index) << text;
  }
}

}  // namespace
}  // namespace strata
