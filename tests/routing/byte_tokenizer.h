#pragma once
// A tokenizer for routing tests: one token per byte (no merges), plus the ChatML control tokens, so that n bytes
// of ASCII text are n tokens and a test can count them by hand.
#include <string>
#include <utility>

#include "model/byte_level.h"
#include "model/tokenizer.h"

namespace strata::test {

constexpr int kImStart = 256;
constexpr int kImEnd = 257;

inline Tokenizer byte_tokenizer() {
  TokenizerData data;
  for (int b = 0; b < 256; ++b) {
    data.tokens.push_back(byte_level_encode(std::string(1, char(b))));
    data.token_types.push_back(1);
  }
  data.tokens.push_back("<|im_start|>");
  data.tokens.push_back("<|im_end|>");
  data.token_types.push_back(3);
  data.token_types.push_back(3);
  data.eos_id = kImEnd;
  return Tokenizer(std::move(data));
}

}  // namespace strata::test
