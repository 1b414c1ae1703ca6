#pragma once
// The tasks of `strata eval`. Each turns its texts into EvalJobs for one policy and scores the finished jobs.
//   perplexity: a document's first `prefix` tokens are prefilled (and compressed), the next `tokens` are scored
//               one by one through the compressed cache;
//   passkey:    a five-digit number hidden at a depth of a generated filler text, asked for at the end;
//   agreement:  greedy answers to instructions over a long passage, compared with the answers of `full`.
// The texts come from eval/data (eval_data.h); the filler and the pass keys are generated here.
#include <cstdint>
#include <string>
#include <vector>

#include "eval/eval_runner.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace strata {

struct PerplexityCase {
  std::string document;         // a name from eval/data
  int prefix = 0;               // prompt tokens
  int tokens = 0;               // scored tokens after the prompt
};
struct PerplexityScore {
  PerplexityCase c;
  double mean_nll = 0.0;        // mean of -log p over the scored tokens
  double memory_ratio = 0.0;    // what `full` would hold over what the job held at its end: 1 compressed nothing
  double perplexity() const;
};

struct PasskeyCase {
  int length = 0;               // prompt tokens, about
  double depth = 0.0;           // where the key sits, 0 (start) to 1 (end)
};
struct PasskeyScore {
  PasskeyCase c;
  std::string key;
  std::string answer;           // the generated text
  bool correct = false;         // the answer contains the key
};

struct AgreementCase {
  int prompt = 0;               // index into the instruction list
  int context = 0;              // passage tokens
};
struct AgreementScore {
  AgreementCase c;
  int common_prefix = 0;        // leading tokens equal to full's answer
  int compared = 0;             // tokens compared (full's answer length)
  double token_f1 = 0.0;        // bag-of-tokens F1 against full's answer
};

// The token ids of a shipped text (eval/data/<name>.txt).
std::vector<int32_t> document_tokens(const Tokenizer& tokenizer, const std::string& data_dir,
                                     const std::string& name);
// The documents of <data_dir>/documents.txt, in its order.
std::vector<std::string> document_names(const std::string& data_dir);

EvalJob perplexity_job(const std::vector<int32_t>& document, const PerplexityCase& c, const std::string& policy);
PerplexityScore score_perplexity(const PerplexityCase& c, const EvalJob& job);

// The key is drawn from `seed`, so every policy gets the same prompts.
EvalJob passkey_job(const Tokenizer& tokenizer, const ChatTemplate& chat, const PasskeyCase& c, uint64_t seed,
                    const std::string& policy, std::string* key);
PasskeyScore score_passkey(const Tokenizer& tokenizer, const PasskeyCase& c, const std::string& key,
                           const EvalJob& job);

// The instructions (eval/data/instructions.txt, one per line) over passages of the shipped texts.
std::vector<std::string> load_instructions(const std::string& data_dir);
EvalJob agreement_job(const Tokenizer& tokenizer, const ChatTemplate& chat, const std::vector<int32_t>& passage,
                      const std::string& instruction, int answer_tokens, const std::string& policy);
AgreementScore score_agreement(const AgreementCase& c, const std::vector<int32_t>& reference,
                               const EvalJob& job);

}  // namespace strata
