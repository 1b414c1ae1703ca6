#include "eval/retrieval_task.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace strata {

// The design (retrieval_task.h, docs/eval/retrieval-design.md). Changing any of these changes every prompt: rerun
// the probe of the design note before relying on the new wording.
static const char* kNeedleStart = "\nThe secret letters are: ";
static const char* kNeedleEnd = ".\n";
static const char* kQuestionStart = "\nThe secret letters are: ";
// Capital letters, each one token after a space; not A, I, O, U or Y (" A", " I" and " O" are words of the
// filler, U and Y for symmetry).
static const char* kLetters = "BCDEFGHJKLMNPQRSTVWXZ";
static constexpr int kSymbols = 10;  // distinct letters in the needle
static constexpr int kGiven = 6;     // of them repeated in the question; the other 4 are the answer
static constexpr int kSlack = 8;     // the filler stops once it is this close to its token budget

std::vector<std::string> retrieval_document_names() { return {"alice_in_wonderland", "around_the_world_in_80_days"}; }

std::vector<std::string> load_retrieval_texts(const std::string& data_dir) {
  std::vector<std::string> out;
  for (const std::string& name : retrieval_document_names()) {
    const std::string path = data_dir + "/" + name + ".txt";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("eval: cannot read " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(ss.str());
  }
  return out;
}

// Splits one paragraph (whitespace already collapsed) after '.', '!' or '?' (and one closing quote or bracket)
// followed by a space.
static void split_paragraph(const std::string& para, std::vector<std::string>& out) {
  size_t start = 0;
  for (size_t i = 0; i < para.size(); ++i) {
    if (para[i] != '.' && para[i] != '!' && para[i] != '?') continue;
    size_t end = i + 1;
    if (end < para.size() && (para[end] == '"' || para[end] == '\'' || para[end] == ')')) ++end;
    if (end < para.size() && para[end] == ' ') {
      out.push_back(para.substr(start, end - start));
      start = end + 1;
      i = end;
    }
  }
  if (start < para.size()) out.push_back(para.substr(start));
}

std::vector<std::string> retrieval_sentences(const std::vector<std::string>& texts) {
  std::vector<std::string> out;
  for (const std::string& text : texts) {
    std::stringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      std::string para;  // the line with every run of whitespace made one space, none at either end
      for (char ch : line) {
        if (std::isspace(static_cast<unsigned char>(ch))) {
          if (!para.empty() && para.back() != ' ') para += ' ';
        } else {
          para += ch;
        }
      }
      if (!para.empty() && para.back() == ' ') para.pop_back();
      if (!para.empty()) split_paragraph(para, out);
    }
  }
  return out;
}

uint64_t retrieval_seed(uint64_t base, const RetrievalCase& c) {
  return base * 1000003u + uint64_t(c.length) * 131u + uint64_t(c.trial) * 104729u;
}

static std::string join(const std::vector<std::string>& words, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) out += (i > from ? " " : "") + words[i];
  return out;
}

RetrievalPrompt retrieval_prompt(const Tokenizer& tokenizer, const std::vector<std::string>& filler_texts,
                                 const RetrievalCase& c, uint64_t seed) {
  const std::vector<std::string> sentences = retrieval_sentences(filler_texts);
  if (sentences.empty()) throw std::invalid_argument("eval: retrieval has no filler text");
  if (c.depth < 0.0 || c.depth > 1.0) throw std::invalid_argument("eval: retrieval depth outside [0, 1]");
  std::mt19937_64 rng(seed);
  std::string pool = kLetters;  // drawn without replacement: no letter twice, so the copy is unambiguous
  std::vector<std::string> letters;
  for (int i = 0; i < kSymbols; ++i) {
    const size_t k = size_t(rng() % pool.size());
    letters.emplace_back(1, pool[k]);
    pool.erase(k, 1);
  }
  const size_t first = size_t(rng() % sentences.size());

  RetrievalPrompt p;
  p.expected = join(letters, kGiven, kSymbols);
  p.needle = kNeedleStart + join(letters, 0, kSymbols) + kNeedleEnd;
  p.question = kQuestionStart + join(letters, 0, kGiven);
  const auto count = [&](const std::string& s) { return int(tokenizer.encode(s, false).size()); };
  const int budget = c.length - count(p.needle + p.question);
  if (budget < 0) throw std::invalid_argument("eval: retrieval length " + std::to_string(c.length) + " too short");

  // Sentences in the order of the texts from a random one on; one that does not fit is skipped.
  std::vector<const std::string*> chosen;
  std::vector<int> ends;  // filler tokens up to the end of each chosen sentence
  int used = 0;
  for (size_t k = 0; k < sentences.size() && budget - used >= kSlack; ++k) {
    const std::string& s = sentences[(first + k) % sentences.size()];
    const int n = count(" " + s);
    if (used + n > budget) continue;
    chosen.push_back(&s);
    used += n;
    ends.push_back(used);
  }
  // The needle goes to the sentence boundary nearest to `depth` of the filler's tokens.
  const double target = c.depth * double(used);
  size_t before = 0;
  for (size_t i = 0; i < ends.size(); ++i) {
    if (std::abs(double(ends[i]) - target) < std::abs(double(before > 0 ? ends[before - 1] : 0) - target)) {
      before = i + 1;
    }
  }
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (i == before) p.text += p.needle;
    else if (i > 0) p.text += ' ';
    p.text += *chosen[i];
  }
  if (before >= chosen.size()) p.text += p.needle;
  p.text += p.question;
  return p;
}

EvalJob retrieval_job(const Tokenizer& tokenizer, const std::vector<std::string>& filler_texts,
                      const RetrievalCase& c, uint64_t seed, std::string* expected) {
  const RetrievalPrompt p = retrieval_prompt(tokenizer, filler_texts, c, seed);
  EvalJob job;
  job.prompt = tokenizer.encode(p.text, false);
  job.generate = kRetrievalGenerate;
  if (expected) *expected = p.expected;
  return job;
}

RetrievalScore score_retrieval(const RetrievalCase& c, const std::string& expected, const Tokenizer& tokenizer,
                               const EvalJob& job) {
  RetrievalScore s{c, expected, tokenizer.decode(job.generated, true), false, 0};
  size_t a = 0;
  while (a < s.answer.size() && std::isspace(static_cast<unsigned char>(s.answer[a]))) ++a;
  const std::string answer = s.answer.substr(a);
  const auto alnum = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) != 0; };
  s.correct = answer.compare(0, expected.size(), expected) == 0 &&
              (answer.size() == expected.size() || !alnum(answer[expected.size()]));
  // Partial credit: the answer's words in order against the expected letters (a word may end in punctuation).
  std::stringstream want(expected), got(answer);
  std::string w, g;
  while (want >> w && got >> g) {
    if (g.compare(0, w.size(), w) != 0 || (g.size() > w.size() && alnum(g[w.size()]))) break;
    ++s.numbers_right;
  }
  return s;
}

void write_retrieval_prompts(std::ostream& out, const Tokenizer& tokenizer,
                             const std::vector<std::string>& filler_texts, const std::vector<int>& lengths,
                             const std::vector<double>& depths, int trials, uint64_t base_seed) {
  for (int length : lengths) {
    for (double depth : depths) {
      for (int trial = 0; trial < trials; ++trial) {
        const RetrievalCase c{length, depth, trial};
        std::string expected;
        const EvalJob job = retrieval_job(tokenizer, filler_texts, c, retrieval_seed(base_seed, c), &expected);
        const nlohmann::ordered_json line = {{"length", length},     {"depth", depth},
                                             {"trial", trial},       {"expected", expected},
                                             {"generate", job.generate}, {"prompt", job.prompt}};
        out << line.dump() << "\n";
      }
    }
  }
}

}  // namespace strata
