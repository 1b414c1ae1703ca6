#include "eval/ruler_tasks.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <random>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace strata {
namespace {

constexpr std::array<std::string_view, 7> kNames = {"niah_single",     "niah_multikey",     "niah_multivalue",
                                                    "niah_multiquery", "variable_tracking", "common_words",
                                                    "frequent_words"};
constexpr int kNeedles = 4;        // keys of multikey and multiquery, values of multivalue
constexpr int kHops = 4;           // variable tracking: one chain of five variables
constexpr int kCommonWords = 10;   // common words extraction
constexpr int kUncommonTimes = 3;
constexpr int kCodedWords = 40;    // frequent words extraction: the coded vocabulary
constexpr int kFrequentAsked = 3;

class TokenCounter {
 public:
  explicit TokenCounter(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  int operator()(const std::string& s) const { return int(tokenizer_.encode(s, false).size()); }

 private:
  const Tokenizer& tokenizer_;
};

// The filler's words that can stand alone in a list or a key: lowercase letters only, 4 to 9 of them (a word
// capitalised somewhere, such as a name, is left out), sorted so that a seed picks the same ones on any machine.
std::vector<std::string> plain_words(const std::vector<std::string>& sentences) {
  std::set<std::string> words, capitalised;
  for (const std::string& s : sentences) {
    std::string word;
    for (size_t i = 0; i <= s.size(); ++i) {
      const unsigned char ch = i < s.size() ? static_cast<unsigned char>(s[i]) : ' ';
      if (std::isalpha(ch)) {
        word += char(ch);
        continue;
      }
      if (word.size() >= 4 && word.size() <= 9) {
        const bool lower = std::all_of(word.begin(), word.end(), [](char c) { return std::islower(c) != 0; });
        if (lower) words.insert(word);
        else capitalised.insert(std::string(1, char(std::tolower(word[0]))) + word.substr(1));
      }
      word.clear();
    }
  }
  std::vector<std::string> out;
  for (const std::string& w : words) {
    if (!capitalised.count(w)) out.push_back(w);
  }
  return out;
}

// Draws use rng() directly, never a standard distribution or std::shuffle, whose algorithms differ between
// standard libraries: one seed gives one prompt everywhere.
template <typename T>
void shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (size_t i = 0; i + 1 < items.size(); ++i) std::swap(items[i], items[i + size_t(rng() % (items.size() - i))]);
}

// `n` distinct items of `pool`, in a random order.
std::vector<std::string> sample(std::vector<std::string> pool, size_t n, std::mt19937_64& rng) {
  if (pool.size() < n) throw std::invalid_argument("eval: RULER needs more distinct words than the filler has");
  shuffle(pool, rng);
  pool.resize(n);
  return pool;
}

std::string random_letters(size_t n, const char* alphabet, std::mt19937_64& rng) {
  const size_t size = std::char_traits<char>::length(alphabet);
  std::string s;
  for (size_t i = 0; i < n; ++i) s += alphabet[rng() % size];
  return s;
}

// `n` distinct strings from make().
template <typename Make>
std::vector<std::string> distinct(size_t n, Make make) {
  std::vector<std::string> out;
  while (out.size() < n) {
    std::string s = make();
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  }
  return out;
}

std::string join(const std::vector<std::string>& items, std::string_view separator, std::string_view last) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? last : separator;
    out += items[i];
  }
  return out;
}

// Filler sentences in the order of the texts from a random one on, `budget` tokens at most, with `inserts` placed
// at distinct random sentence boundaries, in the order given (the first nearest the start).
std::string haystack(const TokenCounter& count, const std::vector<std::string>& sentences, int budget,
                     const std::vector<std::string>& inserts, std::mt19937_64& rng) {
  if (sentences.empty()) throw std::invalid_argument("eval: RULER has no filler text");
  for (const std::string& s : inserts) budget -= count(" " + s);
  std::vector<const std::string*> chosen;
  int used = 0;
  const size_t first = size_t(rng() % sentences.size());
  for (size_t k = 0; k < sentences.size() && budget - used >= 8; ++k) {
    const std::string& s = sentences[(first + k) % sentences.size()];
    const int n = count(" " + s);
    if (used + n > budget) continue;
    chosen.push_back(&s);
    used += n;
  }
  if (chosen.size() + 1 < inserts.size()) throw std::invalid_argument("eval: RULER length too short for its needles");
  std::vector<size_t> boundaries(chosen.size() + 1);  // before sentence i; chosen.size(): after the last
  for (size_t i = 0; i < boundaries.size(); ++i) boundaries[i] = i;
  std::vector<size_t> at;
  for (size_t i = 0; i < inserts.size(); ++i) {
    const size_t k = i + size_t(rng() % (boundaries.size() - i));
    std::swap(boundaries[i], boundaries[k]);
    at.push_back(boundaries[i]);
  }
  std::sort(at.begin(), at.end());
  std::string text;
  size_t next = 0;
  for (size_t i = 0; i <= chosen.size(); ++i) {
    for (; next < at.size() && at[next] == i; ++next) text += (text.empty() ? "" : " ") + inserts[next];
    if (i < chosen.size()) text += (text.empty() ? "" : " ") + *chosen[i];
  }
  return text;
}

std::string needle(const std::string& key, const std::string& value) {
  return "One of the special magic numbers for " + key + " is: " + value + ".";
}

RulerPrompt needle_prompt(const TokenCounter& count, const std::vector<std::string>& sentences, const RulerCase& c,
                          std::mt19937_64& rng) {
  const std::vector<std::string> words = plain_words(sentences);
  const bool many_keys = c.task == RulerTask::niah_multikey || c.task == RulerTask::niah_multiquery;
  const size_t n_keys = many_keys ? kNeedles : 1;
  const size_t n_values = c.task == RulerTask::niah_single ? 1 : kNeedles;
  const std::vector<std::string> keys = distinct(n_keys, [&] {
    const std::vector<std::string> pair = sample(words, 2, rng);
    return pair[0] + "-" + pair[1];
  });
  const std::vector<std::string> values = distinct(n_values, [&] { return std::to_string(1000000 + rng() % 9000000); });
  std::vector<std::string> needles;
  for (size_t i = 0; i < n_values; ++i) needles.push_back(needle(keys[many_keys ? i : 0], values[i]));
  shuffle(needles, rng);

  RulerPrompt p;
  const bool all = c.task == RulerTask::niah_multivalue || c.task == RulerTask::niah_multiquery;
  const std::string query = c.task == RulerTask::niah_multiquery ? join(keys, ", ", " and ") : keys[0];
  p.expected = c.task == RulerTask::niah_multikey ? std::vector<std::string>{values[0]} : values;
  p.question = all ? "\nWhat are all the special magic numbers for " + query +
                         " mentioned in the provided text? The special magic numbers for " + query +
                         " mentioned in the provided text are"
                   : "\nWhat is the special magic number for " + query +
                         " mentioned in the provided text? The special magic number for " + query +
                         " mentioned in the provided text is";
  const std::string instruction =
      "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you "
      "about the numbers afterwards.\n";
  const int budget = c.length - count(instruction) - count(p.question);
  p.context = instruction + haystack(count, sentences, budget, needles, rng);
  return p;
}

RulerPrompt variable_prompt(const TokenCounter& count, const std::vector<std::string>& sentences, const RulerCase& c,
                            std::mt19937_64& rng) {
  const std::vector<std::string> names =
      distinct(kHops + 1, [&] { return random_letters(5, "ABCDEFGHIJKLMNOPQRSTUVWXYZ", rng); });
  const std::string value = std::to_string(10000 + rng() % 90000);
  std::vector<std::string> chain = {"VAR " + names[0] + " = " + value + "."};
  for (int i = 1; i <= kHops; ++i) chain.push_back("VAR " + names[size_t(i)] + " = VAR " + names[size_t(i) - 1] + ".");
  RulerPrompt p;
  p.expected = names;
  p.question = "\nQuestion: Find all variables that are assigned the value " + value +
               " in the text above. Answer: According to the chain(s) of variable assignment in the text above, " +
               std::to_string(kHops + 1) + " variables are assigned the value " + value + ", they are:";
  const std::string instruction = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
  const int budget = c.length - count(instruction) - count(p.question);
  p.context = instruction + haystack(count, sentences, budget, chain, rng);
  return p;
}

// " 1. word 2. word ...": the list's items numbered in order.
std::string numbered(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? " " : "") + std::to_string(i + 1) + ". " + items[i];
  return out;
}

RulerPrompt common_words_prompt(const TokenCounter& count, const std::vector<std::string>& sentences,
                                const RulerCase& c, std::mt19937_64& rng) {
  const int common_times = std::clamp(30 * c.length / 4096, 6, 30);
  std::vector<std::string> words = plain_words(sentences);
  shuffle(words, rng);
  RulerPrompt p;
  p.expected.assign(words.begin(), words.begin() + kCommonWords);
  p.question = "\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that "
               "appear most often in the list are:";
  const std::string instruction =
      "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
      "that appear most often.\n";
  const int budget = c.length - count(instruction) - count(p.question);
  std::vector<std::string> items;
  int used = 0;
  const auto add = [&](const std::string& word, int times) {
    for (int t = 0; t < times; ++t) {
      items.push_back(word);
      used += count(" " + std::to_string(items.size()) + ". " + word);
    }
  };
  for (const std::string& w : p.expected) add(w, common_times);
  if (used > budget) throw std::invalid_argument("eval: RULER length too short for common words extraction");
  for (size_t k = kCommonWords; k < words.size() && used < budget; ++k) {
    const int before = used;
    const size_t n = items.size();
    add(words[k], kUncommonTimes);
    if (used > budget) {  // the last word does not fit: take it back
      items.resize(n);
      used = before;
      break;
    }
  }
  shuffle(items, rng);
  p.context = instruction + numbered(items);
  return p;
}

// Coded words drawn with probability proportional to 1 / rank^2 until the budget, drawn again until the three most
// frequent are unambiguous (the third strictly more frequent than the fourth).
RulerPrompt frequent_words_prompt(const TokenCounter& count, const RulerCase& c, std::mt19937_64& rng) {
  const std::vector<std::string> coded =
      distinct(kCodedWords, [&] { return random_letters(3 + rng() % 4, "abcdefghijklmnopqrstuvwxyz", rng); });
  std::vector<double> cumulative;  // of the weights 1 / rank^2
  for (int r = 1; r <= kCodedWords; ++r) cumulative.push_back((r > 1 ? cumulative.back() : 0.0) + 1.0 / (double(r) * r));
  const auto zipf = [&] {
    const double u = double(rng() >> 11) * 0x1.0p-53 * cumulative.back();
    return size_t(std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin());
  };
  RulerPrompt p;
  p.question = "\nQuestion: Do not provide any explanation. What are the three most frequently appeared words in the "
               "above coded text? Answer: According to the coded text above, the three most frequently appeared "
               "words are:";
  const std::string instruction = "Read the following coded text and track the frequency of each coded word. Find "
                                  "the three most frequently appeared coded words.\n";
  const int budget = c.length - count(instruction) - count(p.question);
  for (;;) {
    std::string text;
    std::map<std::string, int> times;
    for (int used = 0;;) {
      const std::string& w = coded[std::min(zipf(), coded.size() - 1)];
      used += count(" " + w);
      if (used > budget) break;
      text += (text.empty() ? "" : " ") + w;
      ++times[w];
    }
    std::vector<std::pair<int, std::string>> ranked;
    for (const auto& [w, n] : times) ranked.emplace_back(n, w);
    std::sort(ranked.rbegin(), ranked.rend());
    if (ranked.size() > kFrequentAsked && ranked[kFrequentAsked - 1].first > ranked[kFrequentAsked].first) {
      for (int i = 0; i < kFrequentAsked; ++i) p.expected.push_back(ranked[size_t(i)].second);
      p.context = instruction + text;
      return p;
    }
  }
}

}  // namespace

std::vector<RulerTask> ruler_tasks() {
  std::vector<RulerTask> out;
  for (size_t i = 0; i < kNames.size(); ++i) out.push_back(RulerTask(i));
  return out;
}

std::string_view ruler_task_name(RulerTask task) { return kNames.at(size_t(task)); }

std::optional<RulerTask> parse_ruler_task(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return RulerTask(i);
  }
  return std::nullopt;
}

uint64_t ruler_seed(uint64_t base, const RulerCase& c) {
  return base * 1000003u + uint64_t(c.task) * 7919u + uint64_t(c.length) * 131u + uint64_t(c.trial) * 104729u;
}

RulerPrompt ruler_prompt(const Tokenizer& tokenizer, const std::vector<std::string>& sentences, const RulerCase& c,
                         uint64_t seed) {
  const TokenCounter count(tokenizer);
  std::mt19937_64 rng(seed);
  switch (c.task) {
    case RulerTask::niah_single:
    case RulerTask::niah_multikey:
    case RulerTask::niah_multivalue:
    case RulerTask::niah_multiquery:
      return needle_prompt(count, sentences, c, rng);
    case RulerTask::variable_tracking:
      return variable_prompt(count, sentences, c, rng);
    case RulerTask::common_words:
      return common_words_prompt(count, sentences, c, rng);
    case RulerTask::frequent_words:
      return frequent_words_prompt(count, c, rng);
  }
  throw std::invalid_argument("eval: unknown RULER task");
}

std::vector<std::pair<RulerCase, RulerPrompt>> ruler_prompts(const Tokenizer& tokenizer,
                                                             const std::vector<std::string>& sentences,
                                                             const std::vector<RulerTask>& tasks,
                                                             const std::vector<int>& lengths, int trials,
                                                             uint64_t base_seed) {
  std::vector<std::pair<RulerCase, RulerPrompt>> out;
  for (RulerTask task : tasks) {
    for (int length : lengths) {
      for (int trial = 0; trial < trials; ++trial) {
        const RulerCase c{task, length, trial};
        out.emplace_back(c, ruler_prompt(tokenizer, sentences, c, ruler_seed(base_seed, c)));
      }
    }
  }
  return out;
}

int ruler_generate_tokens(RulerTask task) {
  switch (task) {
    case RulerTask::niah_single:
    case RulerTask::niah_multikey:
      return 16;  // a 7-digit number is 7 tokens (SmolLM2 splits digits)
    case RulerTask::niah_multivalue:
    case RulerTask::niah_multiquery:
      return 48;
    case RulerTask::variable_tracking:
      return 32;
    case RulerTask::common_words:
      return 64;
    case RulerTask::frequent_words:
      return 24;
  }
  return 16;
}

double ruler_recall(const std::vector<std::string>& expected, const std::string& answer) {
  if (expected.empty()) return 0.0;
  const auto lower = [](std::string s) {
    for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  const std::string a = lower(answer);
  int found = 0;
  for (const std::string& e : expected) found += a.find(lower(e)) != std::string::npos;
  return double(found) / double(expected.size());
}

std::string_view ruler_setting_name(RulerSetting setting) {
  return setting == RulerSetting::in_prompt ? "in_prompt" : "after_compression";
}

std::optional<RulerSetting> parse_ruler_setting(std::string_view name) {
  for (RulerSetting s : {RulerSetting::in_prompt, RulerSetting::after_compression}) {
    if (ruler_setting_name(s) == name) return s;
  }
  return std::nullopt;
}

EvalJob ruler_job(const Tokenizer& tokenizer, const RulerPrompt& prompt, RulerTask task, RulerSetting setting) {
  EvalJob job;
  job.prompt = tokenizer.encode(prompt.context, false);
  const std::vector<int32_t> question = tokenizer.encode(prompt.question, false);
  if (setting == RulerSetting::in_prompt) {
    job.prompt.insert(job.prompt.end(), question.begin(), question.end());
  } else {
    job.forced = question;
  }
  job.generate = ruler_generate_tokens(task);
  return job;
}

RulerScore score_ruler(const RulerCase& c, RulerSetting setting, const RulerPrompt& prompt, const Tokenizer& tokenizer,
                       const EvalJob& job) {
  RulerScore s{c, setting, prompt.expected, tokenizer.decode(job.generated, true), 0.0};
  s.recall = ruler_recall(s.expected, s.answer);
  return s;
}

void write_ruler_prompts(std::ostream& out, const Tokenizer& tokenizer,
                         const std::vector<std::pair<RulerCase, RulerPrompt>>& prompts) {
  for (const auto& [c, prompt] : prompts) {
    const nlohmann::ordered_json line = {{"task", ruler_task_name(c.task)},
                                         {"length", c.length},
                                         {"trial", c.trial},
                                         {"expected", prompt.expected},
                                         {"generate", ruler_generate_tokens(c.task)},
                                         {"context", tokenizer.encode(prompt.context, false)},
                                         {"question", tokenizer.encode(prompt.question, false)}};
    out << line.dump() << "\n";
  }
}

}  // namespace strata
