#include "router/prompt_chain.h"

#include "leader/block_hash_chain.h"
#include "routing/openai_protocol.h"

namespace strata {
namespace {

// Any salt: the chain is compared only with the router's own.
constexpr uint64_t kSalt = 0x5374726174615254ULL;

}  // namespace

PromptChain prompt_chain(std::string_view body, ApiDialect dialect, const ProtocolLimits& limits,
                         const Tokenizer& tokenizer, const ChatTemplate& chat_template, int block_size) {
  std::vector<int32_t> tokens;
  try {
    const std::vector<ParsedCompletion> batch = parse_completion_request(body, dialect, limits);
    tokens = prompt_token_ids(batch.front(), tokenizer, chat_template);
  } catch (const std::exception&) {  // ApiError and the tokenizer's: the replica will say what is wrong
    return {};
  }
  return {int(tokens.size()), block_hash_chain(tokens, block_size, kSalt)};
}

}  // namespace strata
