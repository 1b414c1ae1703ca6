#pragma once
// Byte-level BPE (GPT-2 style) with the SmolLM2 pre-tokenizer (every digit its own piece, then the GPT-2 regex),
// special tokens, and decoding. Built from GGUF metadata or from a Hugging Face tokenizer.json.
// ../shared/specs/model_format.md, section 6.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class GgufFile;

// Everything a BPE tokenizer is built from, independent of the file format.
struct TokenizerData {
  std::vector<std::string> tokens;      // id -> token spelled in the byte-level alphabet (U+0120 for space, ...)
  std::vector<int32_t> token_types;     // GGUF token_type: 1 normal, 3 control, 4 user-defined, ... (may be empty)
  std::vector<std::string> merges;      // "left right", rank = index
  std::string pre = "smollm";           // pre-tokenizer name: "smollm" (digits split) or "gpt2"
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  bool add_bos = false;
};

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerData data);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  static Tokenizer from_gguf(const GgufFile& file);
  static Tokenizer from_hf_json(const std::string& tokenizer_json_path);

  // parse_special: exact occurrences of special/control token strings become their ids (for rendered chat
  // templates). Off for untrusted text, so a user cannot inject "<|im_end|>". No BOS is added here: callers
  // prepend bos_id() when add_bos() says so (never for SmolLM2, whose template starts with <|im_start|>).
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  // The raw bytes of one token (special tokens: their literal text).
  std::string token_bytes(int32_t id) const;
  // Every token's raw bytes as text, by id, for the grammar of structured output (grammar/token_mask.h): special
  // tokens are never text and get none, and ids from vocab_size() up to n_columns (a model's padded logits) too.
  std::vector<std::string> text_bytes(int32_t n_columns) const;
  // The token as spelled in the vocabulary (byte-level alphabet), e.g. "Ġworld".
  const std::string& token_text(int32_t id) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;  // lossy UTF-8 (U+FFFD)
  std::optional<int32_t> find_token(std::string_view token_text) const;

  int32_t vocab_size() const;
  bool is_special(int32_t id) const;  // control or user-defined tokens
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Ids that end generation: eos, then whichever of <|im_end|>, <|endoftext|> (ChatML) and <|eot_id|> (Llama 3)
  // the vocabulary has, without repeats. SmolLM2-Instruct: {2, 0}.
  const std::vector<int32_t>& stop_ids() const;
  bool add_bos() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text without ever emitting half a UTF-8 character: bytes of an incomplete
// character are held back until the next token completes it (or flush() replaces them by U+FFFD).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);  // text that became complete with this token (may be empty)
  std::string flush();           // whatever is left, invalid bytes as U+FFFD

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace strata
