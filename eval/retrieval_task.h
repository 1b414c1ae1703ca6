#pragma once
// The retrieval task of `strata eval`: ten random capital letters hidden at a depth of a long text, the first six of
// them repeated at the end, the other four to be generated.
//
// The prompt is plain text (no chat template, no special tokens), e.g. at depth 0.5:
//   <filler sentences> "\nThe secret letters are: B P J Q K F G Z D M.\n" <filler sentences>
//   "\nThe secret letters are: B P J Q K F"
// and the answer is " G Z D M" (greedy). Why this shape (measured on SmolLM2-135M-Instruct with the full cache;
// docs/eval/retrieval-design.md has the tables and the commands):
// - The question repeats the needle's first six letters, so the answer is a copy of what follows them in the
//   needle, which a 135M model does reliably. The passkey task's chat question ("What is the pass key?") it
//   mostly misses beyond depth 0 of 4K tokens.
// - Letters, not numbers: SmolLM2 splits every digit into its own token, so ten two-digit numbers are twenty
//   tokens from an alphabet of ten and a copy has many near matches. A capital letter after a space is one token;
//   ten distinct ones (from 21, no vowels: " A", " I", " O" are words of the filler) reached about 250 to 500
//   tokens further back than numbers did.
// - Filler: whole sentences of two shipped novels, in order from a random one (a sentence that does not fit is
//   skipped), joined by spaces; the needle goes to the sentence boundary nearest to depth x filler tokens. Depth 0
//   is the prompt's first token, depth 1 just before the question. The depths of one trial share their filler and
//   letters (retrieval_seed): only the needle moves.
// - The limit is the model: it copies from up to about 7,500 tokens back and not from 7,750 or more, whatever the
//   wording (a preamble asking to remember the needle, the needle twice or four times, a marker line, a key-value
//   sentence, fewer numbers: all tried). At 8,000 tokens the needle at depth 0 is about 7,980 tokens back and is
//   missed; an independent numpy forward pass of the same weights gives the engine's logits, so the engine is not
//   the cause. The longest length at which `full` passes every depth is given in the design note.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "eval/eval_runner.h"
#include "model/tokenizer.h"

namespace strata {

struct RetrievalCase {
  int length = 0;               // prompt tokens, about (a few more or fewer: the text is encoded whole)
  double depth = 0.0;           // where the needle sits in the filler: 0 (start of the prompt) to 1 (just before
                                // the question)
  int trial = 0;                // several trials of one (length, depth) differ only by their seed
};
struct RetrievalScore {
  RetrievalCase c;
  std::string expected;         // the four letters asked for, "R J D T"
  std::string answer;           // the generated text
  bool correct = false;         // the answer starts (after spaces) with `expected`, then no letter or digit
  int numbers_right = 0;        // 0..4: leading letters of the answer equal to the expected ones (partial credit;
                                // the name is from the first design, two-digit numbers)
};

constexpr int kRetrievalGenerate = 8;  // greedy tokens per job: the four letters take 4 (" R", " J", ...)

// The shipped texts the filler comes from (eval/data/<name>.txt): the two novels of the first eval, plain
// narrative prose.
std::vector<std::string> retrieval_document_names();
std::vector<std::string> load_retrieval_texts(const std::string& data_dir);
// The filler's sentences, in the order of the texts: every line a paragraph, whitespace runs made one space, cut
// after '.', '!' or '?' (and one closing '"', '\'' or ')') followed by a space.
std::vector<std::string> retrieval_sentences(const std::vector<std::string>& texts);

// The seed of one case: the suite's seed mixed with the length and the trial, not the depth. Every policy gets the
// same prompt for a case, and the depths of one trial share their numbers and their filler: only the needle moves
// (a paired comparison of the depths, and prompts that share a prefix).
uint64_t retrieval_seed(uint64_t base, const RetrievalCase& c);

// One prompt as text, and its parts (what the tests check).
struct RetrievalPrompt {
  std::string text;             // the whole prompt
  std::string needle;           // the needle as it appears in text
  std::string question;         // the end of text
  std::string expected;         // the answer
};
RetrievalPrompt retrieval_prompt(const Tokenizer& tokenizer, const std::vector<std::string>& filler_texts,
                                 const RetrievalCase& c, uint64_t seed);

// The job of one case: the prompt encoded as plain text (no chat template, no special tokens), kRetrievalGenerate
// greedy tokens. The policy is left empty for the caller. Deterministic in (filler_texts, c, seed); `expected`
// receives the answer.
EvalJob retrieval_job(const Tokenizer& tokenizer, const std::vector<std::string>& filler_texts,
                      const RetrievalCase& c, uint64_t seed, std::string* expected);
RetrievalScore score_retrieval(const RetrievalCase& c, const std::string& expected, const Tokenizer& tokenizer,
                               const EvalJob& job);

// The prompts of every case (lengths x depths x trials, seeded by retrieval_seed(base_seed, case)) as JSON lines of
// {length, depth, trial, expected, generate, prompt: [token ids]}: what tools/retrieval_probe.py sends to a server
// (`strata eval --dump-retrieval-prompts FILE`).
void write_retrieval_prompts(std::ostream& out, const Tokenizer& tokenizer,
                             const std::vector<std::string>& filler_texts, const std::vector<int>& lengths,
                             const std::vector<double>& depths, int trials, uint64_t base_seed);

}  // namespace strata
