#pragma once
// RULER's synthetic task families (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context
// Language Models?"), generated here from the paper's definitions, seeded, on the shipped texts:
// - needle in a haystack: needles "One of the special magic numbers for <key> is: <7-digit number>." at random
//   sentence boundaries of the filler. single: one needle, asked; multikey: four needles of four keys, one asked
//   (the others distract); multivalue: four numbers for one key, all asked; multiquery: four keys, all asked.
// - variable tracking: a chain "VAR XXXXX = <number>.", then four hops "VAR YYYYY = VAR XXXXX." spread over the
//   filler in order; every variable that holds the number is asked for.
// - common words extraction: a numbered list of words in which ten appear often (30 times from 4,096 tokens on,
//   fewer below) and the others three times each; the ten are asked for.
// - frequent words extraction: coded words (random letters) drawn from a Zipf law of exponent 2; the three most
//   frequent are asked for.
// Each prompt is plain text (no chat template): the instruction and the context, then the question and an answer
// prefix, as RULER prompts base models. The two parts are kept apart so that the question can come after the
// context was compressed (the second setting of strata eval). A task is scored as RULER scores it
// (string_match_all): the share of the expected values that appear in the answer, case-insensitively.
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eval/eval_runner.h"
#include "model/tokenizer.h"

namespace strata {

enum class RulerTask { niah_single, niah_multikey, niah_multivalue, niah_multiquery, variable_tracking, common_words,
                       frequent_words };

std::vector<RulerTask> ruler_tasks();  // every family, in the order above
std::string_view ruler_task_name(RulerTask task);  // "niah_single", ..., "frequent_words"
std::optional<RulerTask> parse_ruler_task(std::string_view name);

struct RulerCase {
  RulerTask task = RulerTask::niah_single;
  int length = 0;  // prompt tokens, about (context and question together)
  int trial = 0;   // several trials of one (task, length) differ only by their seed
};

struct RulerPrompt {
  std::string context;                // the instruction and the context: what the first part of the prompt holds
  std::string question;               // the question and the answer prefix: the prompt's end
  std::vector<std::string> expected;  // the values the answer should hold
};

// The seed of one case: the suite's seed mixed with the task, the length and the trial.
uint64_t ruler_seed(uint64_t base, const RulerCase& c);
// `sentences`: the filler (retrieval_sentences of the shipped texts), whose words also give the keys and the list
// words. Throws std::invalid_argument when the length is too short for the task.
RulerPrompt ruler_prompt(const Tokenizer& tokenizer, const std::vector<std::string>& sentences, const RulerCase& c,
                         uint64_t seed);
// Every case's prompt, task by task, then length by length, then trial by trial, seeded by ruler_seed(base_seed, case).
std::vector<std::pair<RulerCase, RulerPrompt>> ruler_prompts(const Tokenizer& tokenizer,
                                                             const std::vector<std::string>& sentences,
                                                             const std::vector<RulerTask>& tasks,
                                                             const std::vector<int>& lengths, int trials,
                                                             uint64_t base_seed);
// Greedy tokens to generate for a task's answer: room for every expected value and a little more.
int ruler_generate_tokens(RulerTask task);
// The share of `expected` found in `answer` (case-insensitive substrings), 0 to 1.
double ruler_recall(const std::vector<std::string>& expected, const std::string& answer);

// Where the question comes. in_prompt: the question ends the prompt, so a question-aware policy sees it when it
// compresses (RULER as published). after_compression: the context alone is the prompt, compressed at its end;
// the question follows as a continuation, a token a step (what a chat's next turn or a new question about a
// cached document meets). Both settings feed the same tokens: the context's, then the question's.
enum class RulerSetting { in_prompt, after_compression };
std::string_view ruler_setting_name(RulerSetting setting);  // "in_prompt", "after_compression"
std::optional<RulerSetting> parse_ruler_setting(std::string_view name);

struct RulerScore {
  RulerCase c;
  RulerSetting setting = RulerSetting::in_prompt;
  std::vector<std::string> expected;
  std::string answer;   // the generated text
  double recall = 0.0;  // ruler_recall
};

// The job of one case in one setting (the policy left empty for the caller).
EvalJob ruler_job(const Tokenizer& tokenizer, const RulerPrompt& prompt, RulerTask task, RulerSetting setting);
RulerScore score_ruler(const RulerCase& c, RulerSetting setting, const RulerPrompt& prompt, const Tokenizer& tokenizer,
                       const EvalJob& job);

// The prompts of ruler_prompts as JSON lines of {task, length, trial, expected, generate, context: [token ids],
// question: [token ids]}: what a test sends to a server to check the eval's scores against its greedy answers
// (`strata eval --dump-ruler-prompts FILE`).
void write_ruler_prompts(std::ostream& out, const Tokenizer& tokenizer,
                         const std::vector<std::pair<RulerCase, RulerPrompt>>& prompts);

}  // namespace strata
