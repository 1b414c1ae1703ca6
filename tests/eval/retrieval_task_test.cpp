// The retrieval task's prompts (the needle at the asked depth, the length close to the asked one, the question at
// the end, one seed one prompt) on the real tokenizer and the shipped texts, and its scoring on hand-made answers.
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "eval/retrieval_task.h"
#include "model/gguf_file.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::from_gguf(*GgufFile::open(test::smollm2_gguf_path()));
  return t;
}

const std::vector<std::string>& texts() {
  static const std::vector<std::string> t = load_retrieval_texts(test::source_path("eval/data"));
  return t;
}

int tokens(const std::string& s) { return int(tokenizer().encode(s, false).size()); }

TEST(RetrievalTask, SentencesAreCutAfterTheirEnd) {
  const std::vector<std::string> s =
      retrieval_sentences({"One two.  Three?\n\n\"Four!\" five (six.) Seven\n   \nEight. ", "Nine"});
  EXPECT_EQ(s, (std::vector<std::string>{"One two.", "Three?", "\"Four!\"", "five (six.)", "Seven", "Eight.",
                                          "Nine"}));
  const std::vector<std::string> all = retrieval_sentences(texts());
  EXPECT_GT(all.size(), 500u);
  for (const std::string& sentence : all) EXPECT_FALSE(sentence.empty() || sentence.front() == ' ') << sentence;
}

TEST(RetrievalTask, TheNeedleSitsAtTheAskedDepthAndTheQuestionAtTheEnd) {
  for (int length : {2000, 8000}) {
    for (double depth : {0.0, 0.1, 0.25, 0.5, 0.75, 1.0}) {
      const RetrievalCase c{length, depth, 0};
      const RetrievalPrompt p = retrieval_prompt(tokenizer(), texts(), c, retrieval_seed(1, c));
      SCOPED_TRACE("length " + std::to_string(length) + " depth " + std::to_string(depth));
      // The question ends the prompt; the needle is there once, and holds the question's letters then the answer.
      ASSERT_GE(p.text.size(), p.question.size());
      EXPECT_EQ(p.text.substr(p.text.size() - p.question.size()), p.question);
      const size_t at = p.text.find(p.needle);
      ASSERT_NE(at, std::string::npos);
      EXPECT_EQ(p.text.find(p.needle, at + 1), std::string::npos);
      const std::string given = p.question.substr(p.question.find(": ") + 2);
      EXPECT_NE(p.needle.find(": " + given + " " + p.expected + "."), std::string::npos) << p.needle;
      std::string letters = given + " " + p.expected;  // ten distinct capitals, one token each
      EXPECT_EQ(tokens(" " + letters), 10);
      letters.erase(std::remove(letters.begin(), letters.end(), ' '), letters.end());
      std::sort(letters.begin(), letters.end());
      EXPECT_EQ(letters.size(), 10u);
      EXPECT_EQ(std::unique(letters.begin(), letters.end()), letters.end()) << given << " " << p.expected;
      EXPECT_TRUE(std::all_of(letters.begin(), letters.end(), [](char ch) { return ch >= 'B' && ch <= 'Z'; }));
      // Depth: the share of the filler's tokens before the needle, within half a sentence (the longest is about
      // 220 tokens) of the asked one.
      const int before = tokens(p.text.substr(0, at));
      const int filler = tokens(p.text) - tokens(p.needle) - tokens(p.question);
      const double tolerance = 120.0 / double(filler);
      EXPECT_NEAR(double(before) / double(filler), depth, tolerance);
      if (depth == 0.0) { EXPECT_EQ(at, 0u); }  // the prompt starts with the needle
      if (depth == 1.0) { EXPECT_EQ(at + p.needle.size() + p.question.size(), p.text.size()); }
    }
  }
}

TEST(RetrievalTask, TheLengthIsCloseToTheAskedOne) {
  for (int length : {2000, 4000, 8000}) {
    for (int trial = 0; trial < 3; ++trial) {
      const RetrievalCase c{length, 0.5, trial};
      std::string expected;
      const EvalJob job = retrieval_job(tokenizer(), texts(), c, retrieval_seed(1, c), &expected);
      EXPECT_NEAR(int(job.prompt.size()), length, 16) << "trial " << trial;
      EXPECT_LE(int(job.prompt.size()) + job.generate, 8192);  // SmolLM2's context
      EXPECT_EQ(job.generate, kRetrievalGenerate);
      EXPECT_TRUE(job.forced.empty());
      EXPECT_EQ(expected.size(), 7u);  // four letters
      EXPECT_EQ(tokens(" " + expected), 4);
    }
  }
}

TEST(RetrievalTask, OneSeedOnePrompt) {
  const RetrievalCase c{4000, 0.25, 0};
  std::string e1, e2, e3;
  const EvalJob a = retrieval_job(tokenizer(), texts(), c, 42, &e1);
  const EvalJob b = retrieval_job(tokenizer(), texts(), c, 42, &e2);
  const EvalJob other = retrieval_job(tokenizer(), texts(), c, 43, &e3);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(e1, e2);
  EXPECT_NE(a.prompt, other.prompt);
  const RetrievalPrompt start = retrieval_prompt(tokenizer(), texts(), {4000, 0.0, 0}, 42);
  const RetrievalPrompt end = retrieval_prompt(tokenizer(), texts(), {4000, 1.0, 0}, 42);
  EXPECT_EQ(start.needle, end.needle);
  std::string filler = start.text;  // the same filler, the needle elsewhere
  filler.erase(filler.find(start.needle), start.needle.size());
  std::string filler_end = end.text;
  filler_end.erase(filler_end.find(end.needle), end.needle.size());
  EXPECT_EQ(filler, filler_end);
  // Trials and lengths have their own seeds; the depths of a trial share theirs: only the needle moves.
  EXPECT_NE(retrieval_seed(1, {4000, 0.25, 0}), retrieval_seed(1, {4000, 0.25, 1}));
  EXPECT_EQ(retrieval_seed(1, {4000, 0.25, 0}), retrieval_seed(1, {4000, 0.5, 0}));
  EXPECT_NE(retrieval_seed(1, {4000, 0.25, 0}), retrieval_seed(1, {2000, 0.25, 0}));
  EXPECT_NE(retrieval_seed(1, {4000, 0.25, 0}), retrieval_seed(2, {4000, 0.25, 0}));
}

RetrievalScore score(const std::string& answer) {
  EvalJob job;
  job.generated = tokenizer().encode(answer, false);
  return score_retrieval(RetrievalCase{2000, 0.5, 0}, "R J D T", tokenizer(), job);
}

TEST(RetrievalTask, ScoringOnHandMadeAnswers) {
  EXPECT_EQ(score(" R J D T").answer, " R J D T");
  EXPECT_EQ(score(" R J D T").expected, "R J D T");
  for (const char* right : {" R J D T", " R J D T.\n\nThe", "R J D T K M", "\n R J D T", " R J D T, said"}) {
    const RetrievalScore s = score(right);
    EXPECT_TRUE(s.correct) << right;
    EXPECT_EQ(s.numbers_right, 4) << right;
  }
  struct Wrong {
    const char* answer;
    int numbers_right;
  };
  for (const Wrong& w : {Wrong{" L E L E L E", 0}, Wrong{" R J D S", 3}, Wrong{" R J", 2}, Wrong{" R J.\nThe", 2},
                         Wrong{" R J D The", 3}, Wrong{" J D T", 0}, Wrong{" R K D T", 1}, Wrong{"", 0},
                         Wrong{" The secret letters are: R J D T", 0}, Wrong{" r j d t", 0}}) {
    const RetrievalScore s = score(w.answer);
    EXPECT_FALSE(s.correct) << w.answer;
    EXPECT_EQ(s.numbers_right, w.numbers_right) << w.answer;
  }
}

// The probe's prompts (strata eval --dump-retrieval-prompts): one line per case, in order, each the case's job.
TEST(RetrievalTask, WrittenPromptsAreTheJobsOfEveryCase) {
  std::stringstream out;
  write_retrieval_prompts(out, tokenizer(), texts(), {600, 900}, {0.0, 1.0}, 2, 7);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(out, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 8u);
  size_t i = 0;
  for (int length : {600, 900}) {
    for (double depth : {0.0, 1.0}) {
      for (int trial = 0; trial < 2; ++trial, ++i) {
        const RetrievalCase c{length, depth, trial};
        std::string expected;
        const EvalJob job = retrieval_job(tokenizer(), texts(), c, retrieval_seed(7, c), &expected);
        EXPECT_EQ(lines[i]["length"], length);
        EXPECT_EQ(lines[i]["depth"], depth);
        EXPECT_EQ(lines[i]["trial"], trial);
        EXPECT_EQ(lines[i]["expected"], expected);
        EXPECT_EQ(lines[i]["generate"], job.generate);
        EXPECT_EQ(lines[i]["prompt"].get<std::vector<int32_t>>(), job.prompt);
      }
    }
  }
  EXPECT_NE(lines[0]["prompt"], lines[2]["prompt"]);  // the needle moved with the depth
}

}  // namespace
}  // namespace strata
