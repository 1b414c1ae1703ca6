#include "eval/eval_tasks.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>

namespace strata {

// ---- texts ------------------------------------------------------------------------------------------------------

static std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("eval: cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One name per line; lines that are empty or start with '#' are not names.
static std::vector<std::string> text_lines(const std::string& path) {
  std::stringstream in(read_text(path));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
  return out;
}

std::vector<std::string> document_names(const std::string& data_dir) {
  return text_lines(data_dir + "/documents.txt");
}

std::vector<int32_t> document_tokens(const Tokenizer& tokenizer, const std::string& data_dir,
                                     const std::string& name) {
  return tokenizer.encode(read_text(data_dir + "/" + name + ".txt"), false);
}

// ---- perplexity -------------------------------------------------------------------------------------------------

double PerplexityScore::perplexity() const { return std::exp(mean_nll); }

EvalJob perplexity_job(const std::vector<int32_t>& document, const PerplexityCase& c, const std::string& policy) {
  if (c.prefix < 1 || c.tokens < 1 || size_t(c.prefix + c.tokens) > document.size()) {
    throw std::invalid_argument("eval: document '" + c.document + "' has " + std::to_string(document.size()) +
                                " tokens, fewer than prefix " + std::to_string(c.prefix) + " + " +
                                std::to_string(c.tokens) + " scored");
  }
  EvalJob job;
  job.prompt.assign(document.begin(), document.begin() + c.prefix);
  job.forced.assign(document.begin() + c.prefix, document.begin() + c.prefix + c.tokens);
  job.policy = policy;
  return job;
}

PerplexityScore score_perplexity(const PerplexityCase& c, const EvalJob& job) {
  double sum = 0.0;
  for (float lp : job.forced_logprobs) sum -= lp;
  int64_t held = 0, full = 0;
  for (const LayerHeld& l : job.layers) {
    held += l.bytes;
    full += l.uncompressed_bytes;
  }
  return PerplexityScore{c, sum / double(job.forced_logprobs.size()), held > 0 ? double(full) / double(held) : 0.0};
}

// ---- passkey ----------------------------------------------------------------------------------------------------
// The retrieval test of Landmark Attention / LongLoRA, with our own wording: an instruction, filler sentences, the
// key sentence at the chosen depth, more filler, and the question, sent as the user's message of the chat
// template; the answer is primed with "The pass key is" (a 135M instruct model answers the bare question with a
// definition of a key more often than with the number).

static const char* kPasskeyIntro =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and remember it. "
    "I will ask you about it afterwards.\n";
static const char* kFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
static const char* kQuestion = "\nWhat is the pass key?";
static const char* kAnswerStart = "The pass key is";

static std::string passkey_prompt(const ChatTemplate& chat, const std::string& body) {
  const ChatMessage message{"user", body + kQuestion};
  return chat.render({&message, 1}, true) + kAnswerStart;
}

EvalJob passkey_job(const Tokenizer& tokenizer, const ChatTemplate& chat, const PasskeyCase& c, uint64_t seed,
                    const std::string& policy, std::string* key) {
  std::mt19937_64 rng(seed);
  *key = std::to_string(std::uniform_int_distribution<int>(10000, 99999)(rng));
  const std::string needle = "The pass key is " + *key + ". Remember it. " + *key + " is the pass key. ";
  const auto tokens = [&](const std::string& s) { return int(tokenizer.encode(s, true).size()); };
  const int fixed = tokens(passkey_prompt(chat, kPasskeyIntro + needle));
  const int per_filler = tokens(kFiller);
  const int n_filler = std::max(0, (c.length - fixed) / per_filler);
  const int before = int(std::lround(c.depth * n_filler));
  std::string body = kPasskeyIntro;
  for (int i = 0; i < n_filler; ++i) {
    if (i == before) body += needle;
    body += kFiller;
  }
  if (before >= n_filler) body += needle;

  EvalJob job;
  job.prompt = tokenizer.encode(passkey_prompt(chat, body), true);
  job.generate = 8;
  job.policy = policy;
  return job;
}

PasskeyScore score_passkey(const Tokenizer& tokenizer, const PasskeyCase& c, const std::string& key,
                           const EvalJob& job) {
  PasskeyScore s{c, key, tokenizer.decode(job.generated, true), false};
  s.correct = s.answer.find(key) != std::string::npos;
  return s;
}

// ---- agreement --------------------------------------------------------------------------------------------------

std::vector<std::string> load_instructions(const std::string& data_dir) {
  return text_lines(data_dir + "/instructions.txt");
}

EvalJob agreement_job(const Tokenizer& tokenizer, const ChatTemplate& chat, const std::vector<int32_t>& passage,
                      const std::string& instruction, int answer_tokens, const std::string& policy) {
  const ChatMessage message{"user", tokenizer.decode(passage, true) + "\n\n" + instruction};
  EvalJob job;
  job.prompt = tokenizer.encode(chat.render({&message, 1}, true), true);
  job.generate = answer_tokens;
  job.policy = policy;
  return job;
}

AgreementScore score_agreement(const AgreementCase& c, const std::vector<int32_t>& reference, const EvalJob& job) {
  const std::vector<int32_t>& answer = job.generated;
  AgreementScore s{c, 0, int(reference.size()), 0.0};
  while (size_t(s.common_prefix) < std::min(reference.size(), answer.size()) &&
         reference[size_t(s.common_prefix)] == answer[size_t(s.common_prefix)]) {
    ++s.common_prefix;
  }
  std::map<int32_t, int> counts;
  for (int32_t t : reference) ++counts[t];
  int shared = 0;
  for (int32_t t : answer) {
    if (auto it = counts.find(t); it != counts.end() && it->second > 0) {
      --it->second;
      ++shared;
    }
  }
  if (shared > 0) {
    const double precision = double(shared) / double(answer.size());
    const double recall = double(shared) / double(reference.size());
    s.token_f1 = 2.0 * precision * recall / (precision + recall);
  }
  return s;
}

}  // namespace strata
