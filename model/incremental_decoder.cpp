#include "model/tokenizer.h"
#include "model/utf8.h"

namespace strata {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  // Everything up to a trailing, still completable character goes out now; ill-formed bytes become U+FFFD
  // right away, exactly as decoding the whole sequence at once would turn them.
  const size_t n_complete = complete_utf8_prefix_length(pending_);
  std::string text = utf8_decode_lossy(std::string_view(pending_).substr(0, n_complete));
  pending_.erase(0, n_complete);
  return text;
}

std::string IncrementalDecoder::flush() {
  std::string text = utf8_decode_lossy(pending_);
  pending_.clear();
  return text;
}

}  // namespace strata
