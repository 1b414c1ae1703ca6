#pragma once
// POST /tokenize and POST /detokenize, the model's tokenizer for clients that count or inspect tokens (the same
// shape as vLLM's and llama.cpp's servers):
//   /tokenize    {"prompt": text | [ids]} or {"messages": [...], "tools"?, "add_generation_prompt"?: true},
//                "add_special_tokens"?: true, "return_token_strs"?: false
//             -> {"count", "max_model_len", "tokens": [ids], "token_strs": [text] | null}
//                the ids generation would see for that prompt (routing/openai_protocol.h prompt_token_ids), also
//                for a prompt longer than the context, so that a client can tell by how much
//   /detokenize {"tokens": [ids]} -> {"prompt": text}, control tokens written out
// Both take "model" (404 for another) and refuse other fields with 400 naming them.
#include <string>
#include <string_view>

#include "model/chat_template.h"
#include "routing/openai_protocol.h"

namespace strata {

class Tokenizer;

// The response body; throws ApiError.
std::string tokenize_response(std::string_view body, const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                              const ProtocolLimits& limits);
std::string detokenize_response(std::string_view body, const Tokenizer& tokenizer, const ProtocolLimits& limits);

}  // namespace strata
