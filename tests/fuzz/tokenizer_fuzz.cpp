// libFuzzer harness: SmolLM2's tokenizer (model/tokenizer.h) on arbitrary bytes, as a prompt's text reaches it:
// encode with and without special tokens, decode, and the streaming IncrementalDecoder.
// Nothing is expected to throw. Bugs: a crash, a sanitizer report, an id outside the vocabulary, or valid UTF-8
// text that does not come back unchanged from encode -> decode or through the incremental decoder (byte-level
// BPE loses nothing but the bytes whose symbol the vocabulary lacks, which it drops as Hugging Face does).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/byte_level.h"
#include "model/tokenizer.h"
#include "model/utf8.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void check_ids(const strata::Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) strata::fuzz::fail("token id " + std::to_string(id) + " outside the vocabulary");
  }
}

// Whether every byte of the text has its byte-level symbol in the vocabulary (SmolLM2 lacks some control bytes).
bool every_byte_in_vocabulary(const strata::Tokenizer& tokenizer, std::string_view text) {
  for (char byte : text) {
    if (!tokenizer.find_token(strata::byte_level_encode(std::string_view(&byte, 1)))) return false;
  }
  return true;
}

std::string decode_incrementally(const strata::Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  strata::IncrementalDecoder decoder(tokenizer, /*skip_special=*/false);
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  return text + decoder.flush();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  strata::fuzz::smollm2_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const strata::Tokenizer& tokenizer = strata::fuzz::smollm2_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tokenizer.encode(text, /*parse_special=*/false);
  check_ids(tokenizer, ids);
  const std::vector<int32_t> special_ids = tokenizer.encode(text, /*parse_special=*/true);
  check_ids(tokenizer, special_ids);
  tokenizer.decode(special_ids, /*skip_special=*/true);

  // The round trip below holds for valid UTF-8 made of bytes the vocabulary spells.
  if (strata::utf8_decode_lossy(text) != text || !every_byte_in_vocabulary(tokenizer, text)) return 0;
  if (tokenizer.decode(ids, /*skip_special=*/false) != text) strata::fuzz::fail("encode -> decode changed the text");
  if (decode_incrementally(tokenizer, ids) != text) strata::fuzz::fail("the incremental decoder changed the text");
  return 0;
}
