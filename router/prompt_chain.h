#pragma once
// The prompt of a generation request as the replicas will see it: parsed and tokenized as they do
// (routing/openai_protocol.h, the same tokenizer and chat template), then named block by block with the prefix
// cache's hash chain (leader/block_hash_chain.h). The replicas' caches key blocks by their tokens alone: a
// request's kv_compression bounds how much of a cached prefix it may reuse (cache/prefix_reuse.h), not which
// blocks match, so it is no part of the chain either.
#include <cstdint>
#include <string_view>
#include <vector>

#include "routing/protocol_limits.h"

namespace strata {

class ChatTemplate;
class Tokenizer;
enum class ApiDialect;

struct PromptChain {
  int n_tokens = 0;              // the first prompt's (a batch's others share the choice)
  std::vector<uint64_t> blocks;  // the hashes of its full blocks
};

// None (n_tokens 0) when the body does not parse: the replica answers that error.
PromptChain prompt_chain(std::string_view body, ApiDialect dialect, const ProtocolLimits& limits,
                         const Tokenizer& tokenizer, const ChatTemplate& chat_template, int block_size);

}  // namespace strata
