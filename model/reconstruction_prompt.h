#pragma once
// KVzip's request to reconstruct a chunk (cache/scoring_tokens.h) in a model's own tokens: the instruction kvpress's
// KVzipPress gives for every chunk after the first, "\n\nRepeat the part of the previous context exactly, starting
// with", and the text the model's chat template puts after a user message's content when it opens the assistant's
// turn (ChatML: "<|im_end|>\n<|im_start|>assistant\n"), as KVzipPress takes it from the tokenizer's template.
#include "cache/compression_config.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace strata {

ReconstructionPrompt reconstruction_prompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template);

}  // namespace strata
