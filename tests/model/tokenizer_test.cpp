// Tokenizer, pre-tokenizer, byte mapping, UTF-8 helpers and incremental decoding. Expected ids were checked
// against Hugging Face tokenizers via tools/reference_tokenizer.py (tests/model/tokenizer_reference_test.py
// compares the whole corpus).
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/byte_level.h"
#include "model/chat_template.h"
#include "model/gguf_file.h"
#include "model/pretokenizer.h"
#include "model/utf8.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;
using Pieces = std::vector<std::string_view>;

class SmolLm2Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = GgufFile::open(test::smollm2_gguf_path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*gguf_));
  }
  static void TearDownTestSuite() {
    tokenizer_.reset();
    gguf_.reset();
  }
  static const Tokenizer& tok() { return *tokenizer_; }

  // The id of the single-byte token for `byte` (its byte-level symbol).
  static int32_t byte_token(uint8_t byte) {
    std::string symbol;
    append_utf8(symbol, byte_to_unicode(byte));
    auto id = tok().find_token(symbol);
    EXPECT_TRUE(id.has_value()) << "no token for byte " << int(byte);
    return id.value_or(-1);
  }

  static inline std::shared_ptr<GgufFile> gguf_;
  static inline std::unique_ptr<Tokenizer> tokenizer_;
};

// ---- byte mapping ----------------------------------------------------------------------------------------------

TEST(ByteLevel, MapsAsGpt2) {
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_to_unicode('!'), U'!');
  EXPECT_EQ(byte_to_unicode(0xA1), U'\u00A1');
  EXPECT_EQ(byte_to_unicode(0xFF), U'\u00FF');
  EXPECT_EQ(byte_to_unicode(0x00), U'\u0100');
  EXPECT_EQ(byte_to_unicode('\t'), U'\u0109');
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');
  EXPECT_EQ(byte_to_unicode(0x7F), U'\u0121');
  EXPECT_EQ(byte_to_unicode(0xAD), U'\u0143');
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(byte_to_unicode(static_cast<uint8_t>(b))), b);
  EXPECT_FALSE(unicode_to_byte(U' ').has_value());  // space itself is not a symbol: it is spelled U+0120
  EXPECT_FALSE(unicode_to_byte(U'\u0144').has_value());
}

TEST(ByteLevel, EncodesAndDecodesStrings) {
  EXPECT_EQ(byte_level_encode(" world\n"), "\u0120world\u010A");
  EXPECT_EQ(byte_level_decode("\u0120world\u010A"), " world\n");
  EXPECT_EQ(byte_level_encode("\xC3\xA9"), "\u00C3\u00A9");  // é: each UTF-8 byte becomes a symbol
  EXPECT_EQ(byte_level_decode("\u00C3\u00A9"), "\xC3\xA9");
  EXPECT_EQ(byte_level_decode("\u4E2D"), "\u4E2D");  // outside the alphabet: kept as is
}

// ---- UTF-8 -----------------------------------------------------------------------------------------------------

TEST(Utf8, CompletePrefixHoldsBackOnlyCompletableTails) {
  EXPECT_EQ(complete_utf8_prefix_length(""), 0u);
  EXPECT_EQ(complete_utf8_prefix_length("abc"), 3u);
  EXPECT_EQ(complete_utf8_prefix_length("a\xE2\x82"), 1u);         // € missing its last byte
  EXPECT_EQ(complete_utf8_prefix_length("\xF0\x9F\x98"), 0u);      // emoji missing its last byte
  EXPECT_EQ(complete_utf8_prefix_length("\xF0\x9F\x98\x80"), 4u);
  EXPECT_EQ(complete_utf8_prefix_length("a\xFF"), 2u);              // never valid: nothing to wait for
  EXPECT_EQ(complete_utf8_prefix_length("\xE2\x28"), 2u);           // broken before the end
  EXPECT_EQ(complete_utf8_prefix_length("\xE0\x80"), 2u);           // overlong, cannot be completed
  EXPECT_EQ(complete_utf8_prefix_length("\xED\xA0"), 2u);           // surrogate, cannot be completed
}

TEST(Utf8, LossyDecodeReplacesEachMaximalSubpart) {
  // Expected values are Python's bytes.decode("utf-8", "replace"), which follows the same rule as Rust.
  EXPECT_EQ(utf8_decode_lossy("h\xC3\xA9llo"), "h\xC3\xA9llo");
  EXPECT_EQ(utf8_decode_lossy("a\xC3"), "a\uFFFD");
  EXPECT_EQ(utf8_decode_lossy("\xF0\x9F\x98"), "\uFFFD");
  EXPECT_EQ(utf8_decode_lossy("\xF0\x9F\x98" "a"), "\uFFFD" "a");
  EXPECT_EQ(utf8_decode_lossy("\xE0\x80"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8_decode_lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8_decode_lossy("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8_decode_lossy("\xC0\xAF"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8_decode_lossy("\xE2\x82("), "\uFFFD(");
}

// ---- pre-tokenizer ---------------------------------------------------------------------------------------------

TEST(Pretokenizer, SplitsDigitsThenGpt2Pattern) {
  const Pretokenizer smollm(PretokenizerKind::smollm);
  EXPECT_EQ(smollm.split("Hello world! 123"), (Pieces{"Hello", " world", "!", " ", "1", "2", "3"}));
  EXPECT_EQ(smollm.split("  multiple   spaces"), (Pieces{" ", " multiple", "  ", " spaces"}));
  // Contractions are case-sensitive: 'RE is punctuation then a word.
  EXPECT_EQ(smollm.split("I'm we'll THEY'RE"), (Pieces{"I", "'m", " we", "'ll", " THEY", "'", "RE"}));
  EXPECT_EQ(smollm.split("a\nb  \t x\n\n y "), (Pieces{"a", "\n", "b", "  \t", " x", "\n\n", " y", " "}));
  // Every numeric character alone, ASCII or not (Nd, No, Nl); U+3000 is whitespace.
  EXPECT_EQ(smollm.split("x\u0663\u00BD\u216B\u3000\u3000y"),
            (Pieces{"x", "\u0663", "\u00BD", "\u216B", "\u3000", "\u3000", "y"}));
  EXPECT_EQ(smollm.split(""), Pieces{});
}

TEST(Pretokenizer, Gpt2KeepsNumbersTogether) {
  const Pretokenizer gpt2 = Pretokenizer::from_name("gpt2");
  EXPECT_EQ(gpt2.split("Hello world! 123"), (Pieces{"Hello", " world", "!", " 123"}));
  EXPECT_EQ(gpt2.split("pi=3.14"), (Pieces{"pi", "=", "3", ".", "14"}));
}

TEST(Pretokenizer, IllFormedBytesStayCovered) {
  const Pretokenizer smollm(PretokenizerKind::smollm);
  EXPECT_EQ(smollm.split("ab\xFF\xFE" "cd"), (Pieces{"ab", "\xFF\xFE", "cd"}));
}

TEST(Pretokenizer, RejectsUnknownNames) {
  EXPECT_EQ(Pretokenizer::from_name("smollm").kind(), PretokenizerKind::smollm);
  EXPECT_EQ(Pretokenizer::from_name("starcoder").kind(), PretokenizerKind::smollm);
  EXPECT_THROW(Pretokenizer::from_name("llama-bpe"), std::invalid_argument);
}

// ---- SmolLM2 encoding ------------------------------------------------------------------------------------------

TEST_F(SmolLm2Tokenizer, Metadata) {
  EXPECT_EQ(tok().vocab_size(), 49152);
  EXPECT_EQ(tok().bos_id(), 1);
  EXPECT_EQ(tok().eos_id(), 2);
  EXPECT_FALSE(tok().add_bos());
  EXPECT_EQ(tok().stop_ids(), (Ids{2, 0}));  // eos <|im_end|>, then <|endoftext|>
  for (int32_t id = 0; id <= 16; ++id) EXPECT_TRUE(tok().is_special(id)) << id;
  EXPECT_FALSE(tok().is_special(17));
  EXPECT_EQ(tok().token_text(216), "\u0120");
  EXPECT_EQ(tok().token_bytes(216), " ");
  EXPECT_EQ(tok().token_bytes(2), "<|im_end|>");
  EXPECT_EQ(tok().find_token("<|im_start|>"), 1);
  EXPECT_EQ(tok().find_token("no such token"), std::nullopt);
  EXPECT_THROW(tok().token_text(49152), std::out_of_range);
  EXPECT_THROW(tok().token_bytes(-1), std::out_of_range);
}

// The grammar's view of the vocabulary: every token's bytes, none for special tokens or for padded columns.
TEST_F(SmolLm2Tokenizer, TextBytesLeaveOutSpecialTokensAndPadding) {
  const int32_t n = tok().vocab_size();
  const std::vector<std::string> bytes = tok().text_bytes(n + 64);
  ASSERT_EQ(bytes.size(), size_t(n + 64));
  int32_t n_special = 0;
  for (int32_t id = 0; id < n; ++id) {
    n_special += tok().is_special(id);
    EXPECT_EQ(bytes[size_t(id)], tok().is_special(id) ? "" : tok().token_bytes(id)) << "token " << id;
  }
  EXPECT_GT(n_special, 0);
  for (int32_t id : tok().stop_ids()) EXPECT_EQ(bytes[size_t(id)], "");
  for (int32_t id = n; id < n + 64; ++id) EXPECT_EQ(bytes[size_t(id)], "");
  EXPECT_EQ(tok().text_bytes(10).size(), 10u);
}

TEST_F(SmolLm2Tokenizer, MatchesReferenceIds) {
  // The spec's candidate ids, each confirmed with tools/reference_tokenizer.py.
  EXPECT_EQ(tok().encode("Hello, we can use", false), (Ids{19556, 28, 392, 416, 722}));
  EXPECT_EQ(tok().encode("The capital of France is", false), (Ids{504, 3575, 282, 4649, 314}));
  EXPECT_EQ(tok().encode("\n", false), (Ids{198}));
  EXPECT_EQ(tok().encode("Hello world! 123", false), (Ids{19556, 905, 17, 216, 33, 34, 35}));
  EXPECT_EQ(tok().encode("  multiple   spaces", false), (Ids{216, 2701, 256, 5600}));
  EXPECT_EQ(tok().encode("Caf\u00E9 d\u00E9j\u00E0 vu.", false), (Ids{51, 1939, 2756, 32564, 90, 16739, 386, 101, 30}));
  EXPECT_EQ(tok().encode(kSmolLm2SystemPrompt, false),
            (Ids{2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182}));
  // Also from the reference: contractions, CJK, an emoji with a skin tone, \r\n.
  EXPECT_EQ(tok().encode("I'm we'll THEY'RE", false), (Ids{57, 5248, 392, 3060, 6462, 73, 23, 3256}));
  EXPECT_EQ(tok().encode("\u4F60\u597D\u4E16\u754C", false), (Ids{18645, 250, 48392, 138, 7906, 240, 178, 239, 230}));
  EXPECT_EQ(tok().encode("\U0001F44D\U0001F3FD", false), (Ids{10813, 235, 231, 10813, 233, 138}));
  EXPECT_EQ(tok().encode("\r\n", false), (Ids{2738}));
  EXPECT_EQ(tok().encode("", false), Ids{});
}

TEST_F(SmolLm2Tokenizer, SpecialTokensOnlyWhenParsingSpecials) {
  EXPECT_EQ(tok().encode("<|im_start|>user\nHi<|im_end|>\n", true), (Ids{1, 4093, 198, 26843, 2, 198}));
  EXPECT_EQ(tok().encode("a<|im_end|>b", true), (Ids{81, 2, 82}));
  // Untrusted text: the marker is spelled out in ordinary tokens, so a user cannot end the turn.
  const Ids injected = tok().encode("a<|im_end|>b", false);
  EXPECT_EQ(injected, (Ids{81, 44, 108, 306, 79, 486, 108, 46, 82}));
  for (int32_t id : tok().encode("<|im_start|>system\nx<|im_end|><|endoftext|>", false)) {
    EXPECT_FALSE(tok().is_special(id)) << id;
  }
  EXPECT_EQ(tok().decode(injected, true), "a<|im_end|>b");
}

TEST_F(SmolLm2Tokenizer, DropsBytesMissingFromTheVocabularyAsHuggingFaceDoes) {
  // SmolLM2 has no token for bytes 0x04 0x06 0x13 0x14 0x16 0x1D (nor for 0xC0 0xC1 0xF1 0xF2 0xF5-0xFF). HF,
  // with no unk token, drops such symbols silently; the neighbours then merge as if the byte were not there.
  EXPECT_EQ(tok().encode("\x04", false), Ids{});
  EXPECT_EQ(tok().encode("a\x04" "b", false), (Ids{81, 82}));  // separate pieces: "a", "\x04", "b"
  EXPECT_EQ(tok().encode("(\x13)", false), (Ids{1000}));      // one piece: "()" after the drop
  EXPECT_EQ(tok().encode("\U00040000", false), (Ids{218, 218, 218}));  // lead byte 0xF1 dropped
  EXPECT_EQ(tok().decode(tok().encode("(\x13)", false), false), "()");
}

TEST_F(SmolLm2Tokenizer, DecodeRoundTrips) {
  for (std::string_view text : {"Hello, world!", "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n",
                                "\u4F60\u597D \U0001F468\u200D\U0001F469\u200D\U0001F467 caf\u00E9 \u0663\u00BD",
                                "def f(x):\n    return x ** 2  # 12345"}) {
    EXPECT_EQ(tok().decode(tok().encode(text, false), false), text);
  }
  const Ids chat = tok().encode("<|im_start|>user\nHi<|im_end|>\n", true);
  EXPECT_EQ(tok().decode(chat, false), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(tok().decode(chat, true), "user\nHi\n");
  EXPECT_EQ(tok().decode(Ids{byte_token(0xE4), byte_token(0xBD)}, false), "\uFFFD");  // half a CJK character
}

TEST_F(SmolLm2Tokenizer, EncodesConsistentlyFromManyThreads) {
  const std::vector<std::string> texts = {"The quick brown fox jumps over the lazy dog. ",
                                          "\u4F60\u597D\u4E16\u754C \u0645\u0631\u062D\u0628\u0627 ",
                                          "for (int i = 0; i < 10; ++i) { sum += i; } ", "<|im_end|> 2024 "};
  std::vector<Ids> expected;
  for (const auto& text : texts) expected.push_back(tok().encode(text + text + text, false));
  std::vector<std::thread> threads;
  std::atomic<int> n_mismatches = 0;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        const size_t k = (t + round) % texts.size();
        if (tok().encode(texts[k] + texts[k] + texts[k], false) != expected[k]) ++n_mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(n_mismatches, 0);
}

// ---- incremental decoding --------------------------------------------------------------------------------------

TEST_F(SmolLm2Tokenizer, IncrementalDecoderNeverSplitsACharacter) {
  for (std::string_view text : {"\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467",
                                "\u4F60\u597D\u4E16\u754C", "a\u00E9\u20AC\U00010348z"}) {
    IncrementalDecoder decoder(tok());
    std::string streamed;
    for (char c : text) {
      const std::string out = decoder.push(byte_token(static_cast<uint8_t>(c)));
      EXPECT_EQ(complete_utf8_prefix_length(out), out.size());
      EXPECT_EQ(utf8_decode_lossy(out), out) << "a pushed chunk is not whole UTF-8";
      streamed += out;
      EXPECT_TRUE(text.starts_with(streamed));
    }
    streamed += decoder.flush();
    EXPECT_EQ(streamed, text);
  }
}

TEST_F(SmolLm2Tokenizer, IncrementalDecoderHoldsBackUntilTheCharacterCompletes) {
  IncrementalDecoder decoder(tok());
  EXPECT_EQ(decoder.push(byte_token(0xF0)), "");
  EXPECT_EQ(decoder.push(byte_token(0x9F)), "");
  EXPECT_EQ(decoder.push(byte_token(0x91)), "");
  EXPECT_EQ(decoder.push(byte_token(0x8D)), "\U0001F44D");
  EXPECT_EQ(decoder.flush(), "");
}

TEST_F(SmolLm2Tokenizer, IncrementalDecoderFlushesLeftoversAsReplacement) {
  IncrementalDecoder decoder(tok());
  EXPECT_EQ(decoder.push(tok().encode("ok", false).at(0)), "ok");
  EXPECT_EQ(decoder.push(byte_token(0xF0)), "");
  EXPECT_EQ(decoder.push(byte_token(0x9F)), "");
  EXPECT_EQ(decoder.flush(), "\uFFFD");
  EXPECT_EQ(decoder.flush(), "");
  // A byte that can never start a character is replaced at once.
  EXPECT_EQ(decoder.push(byte_token(0x80)), "\uFFFD");
}

TEST_F(SmolLm2Tokenizer, IncrementalDecoderMatchesWholeDecode) {
  const std::string text = "<|im_start|>assistant\nSure! \u4F60\u597D \U0001F44B\U0001F3FE, caf\u00E9 \u0663<|im_end|>";
  const Ids ids = tok().encode(text, true);
  for (bool skip : {true, false}) {
    IncrementalDecoder decoder(tok(), skip);
    std::string streamed;
    for (int32_t id : ids) streamed += decoder.push(id);
    streamed += decoder.flush();
    EXPECT_EQ(streamed, tok().decode(ids, skip));
  }
}

// ---- construction ----------------------------------------------------------------------------------------------

// A vocabulary of every byte symbol plus the given tokens (ids from 256 on).
TokenizerData byte_vocabulary(std::vector<std::string> extra, std::vector<int32_t> extra_types) {
  TokenizerData data;
  for (int b = 0; b < 256; ++b) {
    data.tokens.push_back(byte_level_encode(std::string(1, static_cast<char>(b))));
    data.token_types.push_back(1);
  }
  data.tokens.insert(data.tokens.end(), extra.begin(), extra.end());
  data.token_types.insert(data.token_types.end(), extra_types.begin(), extra_types.end());
  return data;
}

TEST(Tokenizer, SpecialTokensMatchLongestFirst) {
  TokenizerData data = byte_vocabulary({"<|a|>", "<|a|>x", "ab"}, {3, 4, 1});
  data.merges = {"a b"};
  const Tokenizer tok(std::move(data));
  EXPECT_EQ(tok.encode("<|a|>x<|a|>ab", true), (Ids{257, 256, 258}));
  EXPECT_EQ(tok.encode("ab", false), (Ids{258}));
  EXPECT_TRUE(tok.is_special(256));
  EXPECT_TRUE(tok.is_special(257));  // user-defined counts too
  EXPECT_EQ(tok.stop_ids(), Ids{});
}

TEST(Tokenizer, MergesLowestRankFirstThenLeftmost) {
  TokenizerData data = byte_vocabulary({"aa", "aaa", "ab", "aab"}, {1, 1, 1, 1});
  data.merges = {"a b", "a a", "aa b", "aa a"};
  const Tokenizer tok(std::move(data));
  EXPECT_EQ(tok.encode("aab", false), (Ids{'a', 258}));  // "a b" outranks "a a"
  // "a a" at positions 0 and 1 tie: the leftmost wins, then "aa a" joins the rest.
  EXPECT_EQ(tok.encode("aaa", false), (Ids{257}));
  EXPECT_EQ(tok.encode("aaaa", false), (Ids{256, 256}));
}

TEST(Tokenizer, RejectsBadData) {
  TokenizerData bad_merge = byte_vocabulary({}, {});
  bad_merge.merges = {"a z"};  // "az" is not in the vocabulary
  EXPECT_THROW(Tokenizer{bad_merge}, std::invalid_argument);
  TokenizerData no_space = byte_vocabulary({}, {});
  no_space.merges = {"ab"};
  EXPECT_THROW(Tokenizer{no_space}, std::invalid_argument);
  TokenizerData bad_pre = byte_vocabulary({}, {});
  bad_pre.pre = "llama-bpe";
  EXPECT_THROW(Tokenizer{bad_pre}, std::invalid_argument);
  TokenizerData bad_eos = byte_vocabulary({}, {});
  bad_eos.eos_id = 999;
  EXPECT_THROW(Tokenizer{bad_eos}, std::invalid_argument);
  EXPECT_THROW(Tokenizer{TokenizerData{}}, std::invalid_argument);
}

// Writes a GGUF v3 file with string metadata only, enough for Tokenizer::from_gguf to inspect.
void write_string_gguf(const std::string& path, const std::vector<std::pair<std::string, std::string>>& kv) {
  std::ofstream out(path, std::ios::binary);
  const auto u32 = [&](uint32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
  const auto u64 = [&](uint64_t v) { out.write(reinterpret_cast<const char*>(&v), 8); };
  const auto str = [&](const std::string& s) {
    u64(s.size());
    out.write(s.data(), static_cast<std::streamsize>(s.size()));
  };
  out.write("GGUF", 4);
  u32(3);
  u64(0);  // tensors
  u64(kv.size());
  for (const auto& [key, value] : kv) {
    str(key);
    u32(8);  // string
    str(value);
  }
  while (out.tellp() % 32 != 0) out.put('\0');  // the (empty) data section starts aligned
}

TEST(Tokenizer, FromGgufRejectsOtherTokenizerModels) {
  const std::string path = (std::filesystem::temp_directory_path() / "strata_tokenizer_llama.gguf").string();
  write_string_gguf(path, {{"general.architecture", "llama"}, {"tokenizer.ggml.model", "llama"}});
  try {
    Tokenizer::from_gguf(*GgufFile::open(path));
    ADD_FAILURE() << "a SentencePiece tokenizer was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model is \"llama\""), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// Writes the GGUF vocabulary as a Hugging Face tokenizer.json (+ tokenizer_config.json) and loads it back.
class HfJsonTokenizer : public SmolLm2Tokenizer {
 protected:
  std::filesystem::path write_tokenizer_json(bool merges_as_pairs, const nlohmann::json& pre_tokenizer) {
    nlohmann::json vocab = nlohmann::json::object();
    nlohmann::json added = nlohmann::json::array();
    for (int32_t id = 0; id < tok().vocab_size(); ++id) {
      vocab[tok().token_text(id)] = id;
      if (tok().is_special(id)) added.push_back({{"id", id}, {"content", tok().token_text(id)}, {"special", true}});
    }
    nlohmann::json merges = nlohmann::json::array();
    const std::vector<std::string> gguf_merges = gguf_->get_string_array("tokenizer.ggml.merges").value();
    for (const std::string& merge : gguf_merges) {
      const size_t space = merge.find(' ');
      if (merges_as_pairs) {
        merges.push_back({merge.substr(0, space), merge.substr(space + 1)});
      } else {
        merges.push_back(merge);
      }
    }
    const nlohmann::json root = {
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer", pre_tokenizer},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab}, {"merges", merges}}},
    };
    const auto dir = std::filesystem::temp_directory_path() /
                     ("strata_hf_tokenizer_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                      (merges_as_pairs ? "_pairs" : "_strings"));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << root.dump();
    std::ofstream(dir / "tokenizer_config.json")
        << nlohmann::json{{"bos_token", "<|im_start|>"}, {"eos_token", {{"content", "<|im_end|>"}}},
                          {"add_bos_token", false}}
               .dump();
    return dir;
  }

  static nlohmann::json byte_level() {
    return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  }
  static nlohmann::json smollm_pre_tokenizer() {
    return {{"type", "Sequence"},
            {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level()}}};
  }
};

TEST_F(HfJsonTokenizer, MatchesTheGgufTokenizer) {
  for (bool pairs : {false, true}) {
    const auto dir = write_tokenizer_json(pairs, smollm_pre_tokenizer());
    const Tokenizer hf = Tokenizer::from_hf_json((dir / "tokenizer.json").string());
    EXPECT_EQ(hf.vocab_size(), tok().vocab_size());
    EXPECT_EQ(hf.bos_id(), 1);
    EXPECT_EQ(hf.eos_id(), 2);
    EXPECT_EQ(hf.stop_ids(), (Ids{2, 0}));
    for (std::string_view text : {"Hello world! 123", "<|im_start|>user\n\u4F60\u597D<|im_end|>", "x = 3.14159;"}) {
      EXPECT_EQ(hf.encode(text, true), tok().encode(text, true)) << text;
      EXPECT_EQ(hf.encode(text, false), tok().encode(text, false)) << text;
    }
    std::filesystem::remove_all(dir);
  }
}

TEST_F(HfJsonTokenizer, ByteLevelAloneIsGpt2) {
  const auto dir = write_tokenizer_json(false, byte_level());
  const Tokenizer hf = Tokenizer::from_hf_json((dir / "tokenizer.json").string());
  // SmolLM2's merges never join a space to a digit, so only a numeric character with merges of its own (½ is
  // two bytes) shows the difference: " ½" is one piece here. Ids from the reference with ByteLevel alone.
  EXPECT_EQ(hf.encode("ab \u00BD", false), (Ids{369, 3351, 138}));
  EXPECT_EQ(tok().encode("ab \u00BD", false), (Ids{369, 216, 16738}));
  std::filesystem::remove_all(dir);
}

TEST_F(HfJsonTokenizer, RejectsUnsupportedFiles) {
  const auto dir = write_tokenizer_json(false, {{"type", "Metaspace"}});
  EXPECT_THROW(Tokenizer::from_hf_json((dir / "tokenizer.json").string()), std::runtime_error);
  std::filesystem::remove_all(dir);
  EXPECT_THROW(Tokenizer::from_hf_json("/nonexistent/tokenizer.json"), std::runtime_error);
}

}  // namespace
}  // namespace strata
