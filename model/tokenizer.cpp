#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <filesystem>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "model/byte_level.h"
#include "model/gguf_file.h"
#include "model/pretokenizer.h"
#include "model/utf8.h"

namespace strata {

namespace {

constexpr int32_t kTokenTypeNormal = 1;
constexpr int32_t kTokenTypeControl = 3;
constexpr int32_t kTokenTypeUserDefined = 4;
constexpr int32_t kTokenTypeUnused = 5;

// The piece cache is bounded: once full it starts over, so hostile input cannot grow it without limit.
constexpr size_t kMaxCachedPieces = 1 << 16;
constexpr size_t kMaxCachedPieceBytes = 64;

[[noreturn]] void fail_file(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": " + why);
}

[[noreturn]] void fail_merge(size_t rank, const std::string& merge, const std::string& why) {
  throw std::invalid_argument("tokenizer: merge " + std::to_string(rank) + " \"" + merge + "\" " + why);
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Merge {
  int32_t rank;
  int32_t result_id;
};

// One adjacent pair waiting in the merge queue. It is stale when either side has changed since it was queued.
struct MergeCandidate {
  int32_t rank;
  int32_t pos;  // index of the left symbol
  int32_t left_id;
  int32_t right_id;
  int32_t result_id;
  bool operator>(const MergeCandidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;  // lowest rank first, then leftmost
  }
};

struct Symbol {
  int32_t id;    // -1 once merged into its left neighbour
  int32_t next;  // -1 at the end
  int32_t prev;  // -1 at the start
};

}  // namespace

struct Tokenizer::Impl {
  TokenizerData data;
  Pretokenizer pretokenizer;
  std::unordered_map<std::string_view, int32_t> ids_by_text;  // views into data.tokens
  std::unordered_map<uint64_t, Merge> merges;                 // (left id, right id) -> rank and result
  std::array<int32_t, 256> byte_ids{};                        // id of each byte's symbol, -1 if missing
  std::vector<std::string> bytes_by_id;
  std::vector<bool> special_by_id;
  std::vector<std::pair<std::string_view, int32_t>> specials;  // longest first
  std::array<bool, 256> special_first_byte{};                  // quick rejection while scanning text
  std::vector<int32_t> stop_ids;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece -> ids

  explicit Impl(TokenizerData d);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void check_id(int32_t id) const;
};

Tokenizer::Impl::Impl(TokenizerData d) : data(std::move(d)), pretokenizer(Pretokenizer::from_name(data.pre)) {
  const auto n_tokens = static_cast<int32_t>(data.tokens.size());
  if (n_tokens == 0) throw std::invalid_argument("tokenizer: empty vocabulary");
  if (!data.token_types.empty() && data.token_types.size() != data.tokens.size()) {
    throw std::invalid_argument("tokenizer: " + std::to_string(data.token_types.size()) + " token types for " +
                                std::to_string(n_tokens) + " tokens");
  }
  for (const auto* id : {&data.bos_id, &data.eos_id, &data.unk_id, &data.pad_id}) {
    if (*id && (**id < 0 || **id >= n_tokens)) {
      throw std::invalid_argument("tokenizer: special id " + std::to_string(**id) + " outside the vocabulary");
    }
  }

  ids_by_text.reserve(data.tokens.size());
  bytes_by_id.resize(data.tokens.size());
  special_by_id.resize(data.tokens.size());
  for (int32_t id = 0; id < n_tokens; ++id) {
    const std::string& text = data.tokens[id];
    const int32_t type = data.token_types.empty() ? kTokenTypeNormal : data.token_types[id];
    special_by_id[id] = type == kTokenTypeControl || type == kTokenTypeUserDefined;
    bytes_by_id[id] = special_by_id[id] ? text : byte_level_decode(text);
    if (type != kTokenTypeUnused) ids_by_text.emplace(text, id);  // the first of duplicate spellings wins
    if (special_by_id[id] && !text.empty()) {
      specials.emplace_back(text, id);
      special_first_byte[static_cast<uint8_t>(text[0])] = true;
    }
  }
  std::stable_sort(specials.begin(), specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    append_utf8(symbol, byte_to_unicode(static_cast<uint8_t>(b)));
    auto it = ids_by_text.find(symbol);
    byte_ids[b] = it == ids_by_text.end() ? -1 : it->second;
  }

  merges.reserve(data.merges.size());
  for (size_t rank = 0; rank < data.merges.size(); ++rank) {
    const std::string& merge = data.merges[rank];
    const size_t space = merge.find(' ');
    if (space == std::string::npos) fail_merge(rank, merge, "is not \"left right\"");
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    auto left_it = ids_by_text.find(left);
    auto right_it = ids_by_text.find(right);
    auto result_it = ids_by_text.find(std::string(left) + std::string(right));
    // Hugging Face rejects such a vocabulary too (MergeTokenOutOfVocabulary).
    if (left_it == ids_by_text.end() || right_it == ids_by_text.end() || result_it == ids_by_text.end()) {
      fail_merge(rank, merge, "uses or makes a token that is not in the vocabulary");
    }
    merges.emplace(pair_key(left_it->second, right_it->second), Merge{static_cast<int32_t>(rank), result_it->second});
  }

  if (data.eos_id) stop_ids.push_back(*data.eos_id);
  for (std::string_view end_text : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>"}) {
    auto it = ids_by_text.find(end_text);
    if (it != ids_by_text.end() && std::find(stop_ids.begin(), stop_ids.end(), it->second) == stop_ids.end()) {
      stop_ids.push_back(it->second);
    }
  }
}

void Tokenizer::Impl::check_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= data.tokens.size()) {
    throw std::out_of_range("token id " + std::to_string(id) + " outside the vocabulary of " +
                            std::to_string(data.tokens.size()));
  }
}

// BPE over one pre-tokenized piece: lowest-rank adjacent pair first (leftmost on ties), with a priority queue
// over a linked list of symbols, O(n log n).
void Tokenizer::Impl::merge_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_ids[static_cast<uint8_t>(c)];
    // A byte whose symbol is not in the vocabulary is dropped, as Hugging Face does when unk_token is null
    // (SmolLM2 lacks 21 byte symbols: some control bytes and bytes that never occur in UTF-8). Its neighbours
    // then become adjacent and may merge. llama.cpp would fail instead; we match HF, the reference.
    if (id < 0) continue;
    const auto pos = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, -1, pos - 1});
    if (pos > 0) symbols[pos - 1].next = pos;
  }
  if (symbols.empty()) return;

  std::priority_queue<MergeCandidate, std::vector<MergeCandidate>, std::greater<>> queue;
  const auto push_pair = [&](int32_t left_pos) {
    if (left_pos < 0) return;
    const int32_t right_pos = symbols[left_pos].next;
    if (right_pos < 0) return;
    auto it = merges.find(pair_key(symbols[left_pos].id, symbols[right_pos].id));
    if (it == merges.end()) return;
    queue.push({it->second.rank, left_pos, symbols[left_pos].id, symbols[right_pos].id, it->second.result_id});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);

  while (!queue.empty()) {
    const MergeCandidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    // Symbols only grow, so unchanged ids on both sides mean the pair is still there.
    if (left.id != top.left_id || left.next < 0 || symbols[left.next].id != top.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = top.result_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    right.id = -1;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t pos = 0; pos >= 0; pos = symbols[pos].next) out.push_back(symbols[pos].id);
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kMaxCachedPieceBytes) {
    merge_piece(piece, out);
    return;
  }
  {
    std::lock_guard lock(cache_mutex);
    auto it = cache.find(std::string(piece));
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_piece(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard lock(cache_mutex);
  if (cache.size() >= kMaxCachedPieces) cache.clear();
  cache.emplace(std::string(piece), std::move(ids));
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  for (std::string_view piece : pretokenizer.split(text)) encode_piece(piece, out);
}

Tokenizer::Tokenizer(TokenizerData data) : impl_(std::make_unique<Impl>(std::move(data))) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
  const auto require = [&](auto value, std::string_view key) {
    if (!value) throw std::runtime_error(file.path() + ": missing " + std::string(key));
    return *value;
  };
  const std::string model = require(file.get_string("tokenizer.ggml.model"), "tokenizer.ggml.model");
  if (model != "gpt2") {
    throw std::runtime_error(file.path() + ": tokenizer.ggml.model is \"" + model +
                             "\"; only \"gpt2\" (byte-level BPE) is supported");
  }
  TokenizerData data;
  data.tokens = require(file.get_string_array("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens");
  if (auto types = file.get_int_array("tokenizer.ggml.token_type")) {
    data.token_types.assign(types->begin(), types->end());
  }
  data.merges = require(file.get_string_array("tokenizer.ggml.merges"), "tokenizer.ggml.merges");
  data.pre = file.get_string("tokenizer.ggml.pre").value_or("gpt2");
  const auto id = [&](std::string_view key) -> std::optional<int32_t> {
    if (auto value = file.get_int(key)) return static_cast<int32_t>(*value);
    return std::nullopt;
  };
  data.bos_id = id("tokenizer.ggml.bos_token_id");
  data.eos_id = id("tokenizer.ggml.eos_token_id");
  data.unk_id = id("tokenizer.ggml.unknown_token_id");
  data.pad_id = id("tokenizer.ggml.padding_token_id");
  data.add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
  try {
    return Tokenizer(std::move(data));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(file.path() + ": " + e.what());
  }
}

namespace {

// "Digits(individual_digits) then ByteLevel" is SmolLM2's pre-tokenizer; ByteLevel alone is GPT-2's. Anything
// else would give different pieces, so it is rejected rather than approximated.
std::string hf_pretokenizer_name(const nlohmann::json& pre) {
  const auto is_byte_level = [](const nlohmann::json& p) {
    return p.value("type", "") == "ByteLevel" && !p.value("add_prefix_space", false) && p.value("use_regex", true);
  };
  if (is_byte_level(pre)) return "gpt2";
  if (pre.value("type", "") == "Sequence" && pre.contains("pretokenizers")) {
    const auto& list = pre["pretokenizers"];
    if (list.size() == 2 && list[0].value("type", "") == "Digits" && list[0].value("individual_digits", false) &&
        is_byte_level(list[1])) {
      return "smollm";
    }
  }
  throw std::runtime_error("unsupported pre_tokenizer " + pre.dump());
}

// tokenizer_config.json spells a token either as a string or as {"content": ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const auto& value = config[key];
  return value.is_string() ? value.get<std::string>() : value.at("content").get<std::string>();
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& tokenizer_json_path) {
  const auto& path = tokenizer_json_path;
  std::ifstream in(tokenizer_json_path);
  if (!in) fail_file(path, "cannot open");
  try {
    const nlohmann::json root = nlohmann::json::parse(in);
    const auto& model = root.at("model");
    if (model.value("type", "") != "BPE") fail_file(path, "model type is not BPE");
    if (root.contains("normalizer") && !root["normalizer"].is_null()) fail_file(path, "normalizers are not supported");

    TokenizerData data;
    data.pre = hf_pretokenizer_name(root.at("pre_tokenizer"));
    std::vector<std::pair<int32_t, std::string>> entries;
    for (const auto& [text, id] : model.at("vocab").items()) entries.emplace_back(id.get<int32_t>(), text);
    std::vector<std::pair<int32_t, bool>> added;  // id, special
    for (const auto& token : root.value("added_tokens", nlohmann::json::array())) {
      const auto id = token.at("id").get<int32_t>();
      entries.emplace_back(id, token.at("content").get<std::string>());
      added.emplace_back(id, token.value("special", false));
    }
    int32_t n_tokens = 0;
    for (const auto& [id, text] : entries) {
      if (id < 0) fail_file(path, "negative token id");
      n_tokens = std::max(n_tokens, id + 1);
    }
    data.tokens.resize(n_tokens);
    data.token_types.assign(n_tokens, kTokenTypeUnused);  // ids no entry names stay unused
    for (const auto& [id, text] : entries) {
      data.tokens[id] = text;
      data.token_types[id] = kTokenTypeNormal;
    }
    for (const auto& [id, special] : added) data.token_types[id] = special ? kTokenTypeControl : kTokenTypeUserDefined;

    for (const auto& merge : model.at("merges")) {
      // Older files write "left right", tokenizers >= 0.20 writes ["left", "right"].
      data.merges.push_back(merge.is_string() ? merge.get<std::string>()
                                              : merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>());
    }

    const auto config_path = std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
    if (std::ifstream config_in(config_path); config_in) {
      const nlohmann::json config = nlohmann::json::parse(config_in);
      const auto find_id = [&](const char* key) -> std::optional<int32_t> {
        auto text = config_token(config, key);
        if (!text) return std::nullopt;
        auto it = std::find(data.tokens.begin(), data.tokens.end(), *text);
        if (it == data.tokens.end()) fail_file(path, std::string(key) + " \"" + *text + "\" is not in the vocabulary");
        return static_cast<int32_t>(it - data.tokens.begin());
      };
      data.bos_id = find_id("bos_token");
      data.eos_id = find_id("eos_token");
      data.unk_id = find_id("unk_token");
      data.pad_id = find_id("pad_token");
      data.add_bos = config.value("add_bos_token", false);
    }
    return Tokenizer(std::move(data));
  } catch (const nlohmann::json::exception& e) {
    fail_file(path, e.what());
  } catch (const std::invalid_argument& e) {
    fail_file(path, e.what());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  if (!parse_special || impl_->specials.empty()) {
    impl_->encode_plain(text, ids);
    return ids;
  }
  // Leftmost occurrence first, and at one position the longest special token.
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    bool matched = false;
    if (!impl_->special_first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    for (const auto& [special, id] : impl_->specials) {
      if (text.substr(pos, special.size()) != special) continue;
      impl_->encode_plain(text.substr(plain_start, pos - plain_start), ids);
      ids.push_back(id);
      pos += special.size();
      plain_start = pos;
      matched = true;
      break;
    }
    if (!matched) ++pos;
  }
  impl_->encode_plain(text.substr(plain_start), ids);
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  impl_->check_id(id);
  return impl_->bytes_by_id[id];
}

std::vector<std::string> Tokenizer::text_bytes(int32_t n_columns) const {
  std::vector<std::string> bytes(size_t(std::max(n_columns, 0)));
  for (int32_t id = 0; id < std::min(n_columns, vocab_size()); ++id) {
    if (!impl_->special_by_id[id]) bytes[size_t(id)] = impl_->bytes_by_id[id];
  }
  return bytes;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return impl_->data.tokens[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    impl_->check_id(id);
    if (skip_special && impl_->special_by_id[id]) continue;
    bytes += impl_->bytes_by_id[id];
  }
  return utf8_decode_lossy(bytes);
}

std::optional<int32_t> Tokenizer::find_token(std::string_view token_text) const {
  auto it = impl_->ids_by_text.find(token_text);
  if (it == impl_->ids_by_text.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->data.tokens.size()); }

bool Tokenizer::is_special(int32_t id) const {
  impl_->check_id(id);
  return impl_->special_by_id[id];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->data.bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->data.eos_id; }
const std::vector<int32_t>& Tokenizer::stop_ids() const { return impl_->stop_ids; }
bool Tokenizer::add_bos() const { return impl_->data.add_bos; }

}  // namespace strata
