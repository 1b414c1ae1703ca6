#pragma once
// ProtocolLimits in a header of its own, so that routing/http_server.h, whose ServerOptions holds one, stays cheap
// to include.
#include <functional>
#include <string>
#include <vector>

namespace strata {

struct PolicySpec;

// What a request may ask for; checked while parsing (routing/openai_protocol.h).
struct ProtocolLimits {
  std::string model_name;    // the served model id; a request naming another gets 404 model_not_found
  int max_context = 2048;    // tokens of prompt + completion
  int vocab_size = 0;        // token ids in a prompt must be below it
  int max_n = 16;            // choices per prompt
  int max_prompts = 64;      // prompts in one completions request (a batch)
  int max_sequences = 256;   // choices in all (n x prompts): the engine queues no more (engine.max_waiting)
  int max_top_logprobs = 20;
  int max_stop = 4;          // stop strings per request
  std::vector<std::string> kv_policies = {"full"};  // KV compression policies a request may choose
  int max_logit_bias = 1024;   // entries of logit_bias
  bool ignore_unknown_fields = false;  // fields unknown to the OpenAI API are ignored instead of refused
  // Throws std::invalid_argument when the engine cannot carry out a kv_compression that is valid in itself (the
  // pool's dtype, PoD's blocks); unset: every valid one is accepted.
  std::function<void(const PolicySpec&)> check_kv_policy;
};

}  // namespace strata
