// RULER's task families (eval/ruler_tasks.h) on the real tokenizer and the shipped texts: each answer key is what
// the generated text holds, read back from the text by an independent parse; lengths as asked; seeds reproduce;
// the scoring on hand-made answers.
#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "eval/retrieval_task.h"
#include "eval/ruler_tasks.h"
#include "model/gguf_file.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::from_gguf(*GgufFile::open(test::smollm2_gguf_path()));
  return t;
}

const std::vector<std::string>& sentences() {
  static const std::vector<std::string> s = retrieval_sentences(load_retrieval_texts(test::source_path("eval/data")));
  return s;
}

RulerPrompt prompt(RulerTask task, int length, int trial = 0) {
  const RulerCase c{task, length, trial};
  return ruler_prompt(tokenizer(), sentences(), c, ruler_seed(1, c));
}

std::vector<std::smatch> matches(const std::string& text, const std::regex& re) {
  std::vector<std::smatch> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back(*it);
  }
  return out;
}

std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

TEST(RulerTasks, NamesRoundTrip) {
  ASSERT_EQ(ruler_tasks().size(), 7u);
  for (RulerTask t : ruler_tasks()) EXPECT_EQ(parse_ruler_task(ruler_task_name(t)), t);
  EXPECT_FALSE(parse_ruler_task("niah"));
}

TEST(RulerTasks, PromptsHaveTheAskedLength) {
  for (RulerTask t : ruler_tasks()) {
    for (int length : {2048, 4096}) {
      const RulerPrompt p = prompt(t, length);
      const int n = int(tokenizer().encode(p.context + p.question, false).size());
      EXPECT_LE(std::abs(n - length), length / 25) << ruler_task_name(t) << " at " << length << ": " << n;
      EXPECT_TRUE(p.question.starts_with("\n")) << ruler_task_name(t);
    }
  }
}

TEST(RulerTasks, OneSeedOnePrompt) {
  for (RulerTask t : ruler_tasks()) {
    const RulerPrompt a = prompt(t, 2048), b = prompt(t, 2048), other = prompt(t, 2048, 1);
    EXPECT_EQ(a.context + a.question, b.context + b.question) << ruler_task_name(t);
    EXPECT_EQ(a.expected, b.expected) << ruler_task_name(t);
    EXPECT_NE(a.context, other.context) << ruler_task_name(t);
  }
}

// The needles found in the text, by key; the keys the question asks for.
TEST(RulerTasks, NeedleAnswersAreTheNumbersTheTextGivesTheAskedKeys) {
  const std::regex needle_re(R"(One of the special magic numbers for ([a-z]+-[a-z]+) is: ([0-9]{7})\.)");
  const std::regex key_re(R"([a-z]+-[a-z]+)");
  struct Shape {
    RulerTask task;
    size_t needles, keys, asked;
  };
  for (const Shape& shape : {Shape{RulerTask::niah_single, 1, 1, 1}, Shape{RulerTask::niah_multikey, 4, 4, 1},
                             Shape{RulerTask::niah_multivalue, 4, 1, 1}, Shape{RulerTask::niah_multiquery, 4, 4, 4}}) {
    for (int trial = 0; trial < 3; ++trial) {
      const RulerPrompt p = prompt(shape.task, 2048, trial);
      std::map<std::string, std::vector<std::string>> by_key;
      const auto found = matches(p.context, needle_re);
      for (const std::smatch& m : found) by_key[m[1]].push_back(m[2]);
      EXPECT_EQ(found.size(), shape.needles) << ruler_task_name(shape.task);
      EXPECT_EQ(by_key.size(), shape.keys) << ruler_task_name(shape.task);
      std::set<std::string> asked;
      for (const std::smatch& m : matches(p.question, key_re)) asked.insert(m[0]);
      EXPECT_EQ(asked.size(), shape.asked) << p.question;
      std::vector<std::string> want;
      for (const std::string& k : asked) want.insert(want.end(), by_key[k].begin(), by_key[k].end());
      EXPECT_EQ(as_set(p.expected), as_set(want)) << ruler_task_name(shape.task);
      EXPECT_EQ(p.expected.size(), want.size());
    }
  }
}

// Every variable whose chain of assignments ends in the number the question names.
TEST(RulerTasks, VariableTrackingAnswersFollowTheChain) {
  const std::regex value_re(R"(VAR ([A-Z]{5}) = ([0-9]+)\.)"), copy_re(R"(VAR ([A-Z]{5}) = VAR ([A-Z]{5})\.)");
  for (int trial = 0; trial < 3; ++trial) {
    const RulerPrompt p = prompt(RulerTask::variable_tracking, 4096, trial);
    std::map<std::string, std::string> value, source;
    for (const std::smatch& m : matches(p.context, value_re)) value[m[1]] = m[2];
    for (const std::smatch& m : matches(p.context, copy_re)) source[m[1]] = m[2];
    for (int hop = 0; hop < 8; ++hop) {
      for (const auto& [var, from] : source) {
        if (value.count(from)) value[var] = value[from];
      }
    }
    std::smatch asked;
    ASSERT_TRUE(std::regex_search(p.question, asked, std::regex(R"(assigned the value ([0-9]+) in)")));
    std::vector<std::string> want;
    for (const auto& [var, v] : value) {
      if (v == asked[1]) want.push_back(var);
    }
    EXPECT_EQ(want.size(), 5u);
    EXPECT_EQ(as_set(p.expected), as_set(want));
    // In the text the chain reads forward: each variable's assignment comes after the one it copies.
    for (const auto& [var, from] : source) {
      EXPECT_LT(p.context.find("VAR " + from + " ="), p.context.find("VAR " + var + " =")) << var;
    }
  }
}

// The list is numbered 1..n; ten words appear more often than every other one, and they are the answer.
TEST(RulerTasks, CommonWordsAreTheTenMostFrequentInTheList) {
  const std::regex item_re(R"((\d+)\. ([a-z]+))");
  for (int length : {2048, 4096}) {
    const RulerPrompt p = prompt(RulerTask::common_words, length);
    std::map<std::string, int> times;
    int next = 1;
    for (const std::smatch& m : matches(p.context, item_re)) {
      EXPECT_EQ(std::stoi(m[1]), next++);
      ++times[m[2]];
    }
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [w, n] : times) ranked.emplace_back(n, w);
    std::sort(ranked.rbegin(), ranked.rend());
    ASSERT_GT(ranked.size(), 10u);
    EXPECT_GT(ranked[9].first, ranked[10].first);
    std::vector<std::string> top;
    for (int i = 0; i < 10; ++i) top.push_back(ranked[size_t(i)].second);
    EXPECT_EQ(as_set(p.expected), as_set(top));
    EXPECT_EQ(ranked[0].first, std::clamp(30 * length / 4096, 6, 30));
  }
}

TEST(RulerTasks, FrequentWordsAreTheThreeMostFrequentCodedWords) {
  for (int trial = 0; trial < 3; ++trial) {
    const RulerPrompt p = prompt(RulerTask::frequent_words, 2048, trial);
    const std::string text = p.context.substr(p.context.find('\n') + 1);
    std::map<std::string, int> times;
    for (const std::smatch& m : matches(text, std::regex("[a-z]+"))) ++times[m[0]];
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [w, n] : times) ranked.emplace_back(n, w);
    std::sort(ranked.rbegin(), ranked.rend());
    ASSERT_GT(ranked.size(), 3u);
    EXPECT_GT(ranked[2].first, ranked[3].first);
    EXPECT_EQ(as_set(p.expected), as_set({ranked[0].second, ranked[1].second, ranked[2].second}));
  }
}

TEST(RulerTasks, RecallIsTheShareOfExpectedValuesInTheAnswer) {
  const std::vector<std::string> expected = {"1234567", "QPKZD", "apple"};
  EXPECT_DOUBLE_EQ(ruler_recall(expected, " 1234567, qpkzd and Apple."), 1.0);
  EXPECT_DOUBLE_EQ(ruler_recall(expected, " 1234567 and 7654321"), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(ruler_recall(expected, " 123456 QPKZ appl"), 0.0);
  EXPECT_DOUBLE_EQ(ruler_recall(expected, ""), 0.0);
  EXPECT_DOUBLE_EQ(ruler_recall({}, "anything"), 0.0);
}

TEST(RulerTasks, TooShortALengthIsRefused) {
  EXPECT_THROW(prompt(RulerTask::common_words, 300), std::invalid_argument);
  EXPECT_THROW(prompt(RulerTask::niah_multiquery, 60), std::invalid_argument);
}

}  // namespace
}  // namespace strata
