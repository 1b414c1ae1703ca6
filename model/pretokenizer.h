#pragma once
// Splits text into the pieces that BPE encodes one at a time (../shared/specs/model_format.md, section 6.2).
//   gpt2:   the GPT-2 pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   smollm: every numeric character (Rust char::is_numeric: Nd, Nl, No) as its own piece first, as HF's
//           Digits(individual_digits) does, then the GPT-2 pattern on the text between them.
// \s is the Unicode White_Space property (what Oniguruma's \s matches in HF tokenizers); categories come from ICU.
// Bytes that are not well-formed UTF-8 are each treated as one character of no category (neither letter, number
// nor space), so that the pieces still cover the input exactly.
#include <string_view>
#include <vector>

namespace strata {

enum class PretokenizerKind { gpt2, smollm };

class Pretokenizer {
 public:
  explicit Pretokenizer(PretokenizerKind kind) : kind_(kind) {}
  // GGUF tokenizer.ggml.pre names: "smollm" and the llama.cpp names that share its pattern (starcoder, refact,
  // command-r, codeshell, exaone), "gpt2"/"gpt-2". Throws std::invalid_argument naming any other value, since
  // a different pattern would silently produce different ids.
  static Pretokenizer from_name(std::string_view name);

  // Pieces in order; they are views into text and concatenate to exactly text.
  std::vector<std::string_view> split(std::string_view text) const;
  PretokenizerKind kind() const { return kind_; }

 private:
  PretokenizerKind kind_;
};

}  // namespace strata
