#include "model/model_loader.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/model/gguf_test_writer.h"
#include "tests/model/safetensors_test_writer.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using test::GgufTestWriter;
using test::SafetensorsTestWriter;
using test::TempFile;

// Most tests below compare values and load with WeightDtype::f32 (the reference path); those of the other dtypes
// read values through the format's dequantization.
float at(const WeightMatrix& m, int64_t r, int64_t c) {
  if (m.format == WeightFormat::f32) return m.f32()[r * m.cols + c];
  std::vector<float> row(static_cast<size_t>(m.cols));
  dequantize_weight_row(m.format, m.row(r), row.data(), m.cols);
  return row[static_cast<size_t>(c)];
}

// Expects `part` to equal rows [row0, row0 + part.rows) and columns [col0, col0 + part.cols) of `whole`.
void expect_sub_matrix(const WeightMatrix& part, const WeightMatrix& whole, int64_t row0, int64_t col0,
                       const std::string& what) {
  ASSERT_NE(part.data, nullptr) << what;
  ASSERT_LE(row0 + part.rows, whole.rows) << what;
  ASSERT_LE(col0 + part.cols, whole.cols) << what;
  for (int64_t r = 0; r < part.rows; ++r) {
    ASSERT_EQ(std::memcmp(part.f32() + r * part.cols, whole.f32() + (row0 + r) * whole.cols + col0,
                          static_cast<size_t>(part.cols) * sizeof(float)),
              0)
        << what << " row " << r;
  }
}

void expect_shape(const WeightMatrix& m, int64_t rows, int64_t cols, const std::string& what) {
  EXPECT_NE(m.data, nullptr) << what;
  EXPECT_EQ(m.rows, rows) << what;
  EXPECT_EQ(m.cols, cols) << what;
}

// ---------------------------------------------------------------------------------------------------------------
// Configs

GgufTestWriter minimal_llama_metadata() {
  GgufTestWriter w;
  w.add_string("general.architecture", "llama");
  w.add("llama.block_count", GgufValueType::u8, uint8_t{2});            // any integer width is accepted
  w.add("llama.embedding_length", GgufValueType::u64, uint64_t{32});
  w.add("llama.feed_forward_length", GgufValueType::i32, int32_t{64});
  w.add("llama.attention.head_count", GgufValueType::u16, uint16_t{4});
  w.add("llama.context_length", GgufValueType::u32, uint32_t{128});
  w.add("llama.attention.layer_norm_rms_epsilon", GgufValueType::f32, 1e-6f);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e", "f", "g", "h"});
  return w;
}

TEST(ConfigFromGguf, DefaultsAndWidening) {
  TempFile f(minimal_llama_metadata().bytes());
  const ModelConfig c = config_from_gguf(*GgufFile::open(f.path()));
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.d_ff, 64);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 4);  // head_count_kv absent
  EXPECT_EQ(c.head_dim, 8);    // key_length absent
  EXPECT_EQ(c.max_context, 128);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.rope_theta, 10000.0f);  // freq_base absent
  EXPECT_EQ(c.vocab_size, 8);          // from the token list
  EXPECT_EQ(c.rope_style, RopeStyle::interleaved);
  EXPECT_TRUE(c.tied_embeddings);      // no output.weight
}

TEST(ConfigFromGguf, VocabFromEmbeddingAndUntiedOutput) {
  GgufTestWriter w;
  w.add_string("general.architecture", "llama");
  w.add("llama.block_count", GgufValueType::u32, uint32_t{1});
  w.add("llama.embedding_length", GgufValueType::u32, uint32_t{4});
  w.add("llama.feed_forward_length", GgufValueType::u32, uint32_t{8});
  w.add("llama.attention.head_count", GgufValueType::u32, uint32_t{2});
  w.add("llama.attention.head_count_kv", GgufValueType::u32, uint32_t{1});
  w.add("llama.context_length", GgufValueType::u32, uint32_t{16});
  w.add("llama.attention.layer_norm_rms_epsilon", GgufValueType::f32, 1e-5f);
  w.add("llama.rope.freq_base", GgufValueType::f32, 500000.0f);
  w.add_f32_tensor("token_embd.weight", {4, 3}, std::vector<float>(12));
  w.add_f32_tensor("output.weight", {4, 3}, std::vector<float>(12));
  TempFile f(w.bytes());
  const ModelConfig c = config_from_gguf(*GgufFile::open(f.path()));
  EXPECT_EQ(c.vocab_size, 3);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_FALSE(c.tied_embeddings);
}

TEST(ConfigFromGguf, MissingKeysAreNamed) {
  // A minimal header without `key`.
  for (const std::string key : {"llama.block_count", "llama.attention.head_count",
                                "llama.attention.layer_norm_rms_epsilon", "general.architecture"}) {
    GgufTestWriter w;
    if (key != "general.architecture") w.add_string("general.architecture", "llama");
    if (key != "llama.block_count") w.add("llama.block_count", GgufValueType::u32, uint32_t{2});
    w.add("llama.embedding_length", GgufValueType::u32, uint32_t{32});
    w.add("llama.feed_forward_length", GgufValueType::u32, uint32_t{64});
    if (key != "llama.attention.head_count") w.add("llama.attention.head_count", GgufValueType::u32, uint32_t{4});
    w.add("llama.context_length", GgufValueType::u32, uint32_t{128});
    if (key != "llama.attention.layer_norm_rms_epsilon") {
      w.add("llama.attention.layer_norm_rms_epsilon", GgufValueType::f32, 1e-6f);
    }
    TempFile f(w.bytes());
    try {
      config_from_gguf(*GgufFile::open(f.path()));
      ADD_FAILURE() << "missing " << key << " was accepted";
    } catch (const GgufError& e) {
      EXPECT_NE(std::string(e.what()).find("missing metadata key '" + key + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(ConfigFromGguf, WrongArchitectureAndTypes) {
  GgufTestWriter qwen;
  qwen.add_string("general.architecture", "qwen2");
  TempFile f1(qwen.bytes());
  EXPECT_THROW(config_from_gguf(*GgufFile::open(f1.path())), GgufError);

  GgufTestWriter w = minimal_llama_metadata();
  w.add_string("llama.attention.head_count_kv", "four");
  TempFile f2(w.bytes());
  try {
    config_from_gguf(*GgufFile::open(f2.path()));
    ADD_FAILURE() << "a string head count was accepted";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("llama.attention.head_count_kv"), std::string::npos) << e.what();
  }
}

std::string write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

TEST(ConfigFromHfJson, Llama31) {
  test::TempDir dir;
  const std::string path = write_text(dir.path() / "config.json", R"({
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false, "head_dim": null,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  const ModelConfig c = config_from_hf_json(path);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_style, RopeStyle::half_split);
  EXPECT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_context, 8192);
  EXPECT_FALSE(c.tied_embeddings);
  const ModelConfig preset = preset_config("llama-3-8b");
  EXPECT_EQ(preset.d_ff, c.d_ff);
  EXPECT_EQ(preset.vocab_size, c.vocab_size);
  EXPECT_EQ(preset.rope_scaling.factor, c.rope_scaling.factor);
}

TEST(ConfigFromHfJson, ErrorsNameTheKeyAndTheFile) {
  test::TempDir dir;
  auto expect_error = [&](const std::string& json, const std::string& fragment) {
    const std::string path = write_text(dir.path() / "config.json", json);
    try {
      config_from_hf_json(path);
      ADD_FAILURE() << "accepted: " << json;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"model_type": "llama", "num_hidden_layers": 2})", "'hidden_size' is missing");
  expect_error(R"({"model_type": "gpt2"})", "'model_type'");
  expect_error(R"({"model_type": "llama", "hidden_size": "big"})", "'hidden_size' must be an integer");
  expect_error(R"({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "intermediate_size": 8, "vocab_size": 4, "rope_scaling": {"type": "linear", "factor": 2}})",
               "'rope_scaling.type'");
  expect_error("{", "invalid JSON");
  EXPECT_THROW(config_from_hf_json((dir.path() / "absent.json").string()), std::runtime_error);
}

TEST(PresetConfig, KnownNames) {
  const ModelConfig small = preset_config("smollm2-135m");
  EXPECT_EQ(small.n_layers, 30);
  EXPECT_TRUE(small.tied_embeddings);
  const ModelConfig big = preset_config("llama-3-70b");
  EXPECT_EQ(big.n_layers, 80);
  EXPECT_EQ(big.d_model, 8192);
  EXPECT_EQ(big.n_heads, 64);
  EXPECT_EQ(big.n_kv_heads, 8);
  EXPECT_EQ(big.head_dim, 128);
  EXPECT_EQ(big.d_ff, 28672);
  EXPECT_EQ(big.vocab_size, 128256);
  EXPECT_EQ(big.rope_theta, 500000.0f);
  EXPECT_FALSE(big.tied_embeddings);
  EXPECT_EQ(preset_config("llama-3-8b").max_context, 131072);
  try {
    preset_config("gpt-5");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("gpt-5"), std::string::npos);
    EXPECT_NE(message.find("smollm2-135m, llama-3-8b, llama-3-70b"), std::string::npos) << message;
  }
}

TEST(PresetConfig, FewerLayers) {
  const ModelConfig c = preset_config("llama-3-70b@layers=40");
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.d_ff, 28672);
  EXPECT_EQ(c.max_context, 131072);
  for (const char* bad : {"llama-3-70b@layers=0", "llama-3-70b@layers=81", "llama-3-70b@layers=4x",
                          "llama-3-70b@layers=", "llama-3-70b@depth=4"}) {
    try {
      preset_config(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("layers"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Small synthetic models, with values known at every position: value(tensor, row, col) is exact in f16/bf16/q8_0.

float value(int tensor, int64_t row, int64_t col) {
  return static_cast<float>((tensor * 7 + row * 3 + col * 5) % 17 - 8) / 8.0f;
}

constexpr int kD = 32, kHeads = 4, kKv = 2, kHeadDim = 8, kFf = 64, kVocab = 16, kLayers = 2;

// A Q5_0 block (f16 d = 1/8) or a Q5_1 one (d = 1/8, m = -2) of the 32 values v(j), each k / 8 with |k| <= 8, as
// the codes v * 8 + 16: the header, the fifth bits (qh), then the low nibbles (qs).
template <class Values>
void append_q5_block(std::vector<uint8_t>& out, bool with_offset, Values v) {
  std::vector<uint8_t> block = {0x00, 0x30};
  if (with_offset) block.insert(block.end(), {0x00, 0xC0});
  const size_t qh_at = block.size();
  block.resize(qh_at + 4 + 16, 0);
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) {
    const int q = static_cast<int>(v(j) * 8) + 16;
    qh |= static_cast<uint32_t>(q >> 4) << j;
    block[qh_at + 4 + j % 16] |= static_cast<uint8_t>((q & 0xF) << (j < 16 ? 0 : 4));
  }
  for (int k = 0; k < 4; ++k) block[qh_at + k] = static_cast<uint8_t>(qh >> (8 * k));
  out.insert(out.end(), block.begin(), block.end());
}

std::vector<uint8_t> encode(uint32_t type_id, int tensor, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = value(tensor, r, c);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (type_id == 0) {  // f32
        out.insert(out.end(), reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + 4);
      } else if (type_id == 1) {  // f16: v = k / 8 with |k| <= 8 is exact; build it from the f32 bits
        const uint32_t sign = (bits >> 16) & 0x8000, exp = (bits >> 23) & 0xFF, mant = (bits >> 13) & 0x3FF;
        const uint16_t h = v == 0.0f ? 0 : static_cast<uint16_t>(sign | ((exp - 112) << 10) | mant);
        out.push_back(static_cast<uint8_t>(h & 0xFF));
        out.push_back(static_cast<uint8_t>(h >> 8));
      } else if (type_id == 30) {  // bf16: the top half
        out.push_back(static_cast<uint8_t>((bits >> 16) & 0xFF));
        out.push_back(static_cast<uint8_t>(bits >> 24));
      } else if (type_id == 6 || type_id == 7) {  // q5_0 (d = 1/8) or q5_1 (d = 1/8, m = -2): code v * 8 + 16
        if (c % 32 == 0) append_q5_block(out, type_id == 7, [&](int j) { return value(tensor, r, c + j); });
      } else {  // q8_0 with d = 1/8
        if (c % 32 == 0) {
          out.push_back(0x00);
          out.push_back(0x30);
        }
        out.push_back(static_cast<uint8_t>(static_cast<int8_t>(v * 8)));
      }
    }
  }
  return out;
}

struct TinyTensor {
  std::string gguf_name, hf_name;
  int64_t rows, cols;
  uint32_t type_id;  // in the GGUF; safetensors use F32/F16/BF16 by the same rule, q8_0, q5_0 and q5_1 -> BF16
};

std::vector<TinyTensor> tiny_tensors() {
  std::vector<TinyTensor> t = {{"token_embd.weight", "model.embed_tokens.weight", kVocab, kD, 1},
                               {"output_norm.weight", "model.norm.weight", 1, kD, 0},
                               {"output.weight", "lm_head.weight", kVocab, kD, 8}};
  for (int l = 0; l < kLayers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    t.push_back({g + "attn_norm.weight", h + "input_layernorm.weight", 1, kD, 0});
    t.push_back({g + "attn_q.weight", h + "self_attn.q_proj.weight", kHeads * kHeadDim, kD, 8});
    t.push_back({g + "attn_k.weight", h + "self_attn.k_proj.weight", kKv * kHeadDim, kD, 1});
    t.push_back({g + "attn_v.weight", h + "self_attn.v_proj.weight", kKv * kHeadDim, kD, 6});
    t.push_back({g + "attn_output.weight", h + "self_attn.o_proj.weight", kD, kHeads * kHeadDim, 8});
    t.push_back({g + "ffn_norm.weight", h + "post_attention_layernorm.weight", 1, kD, 0});
    t.push_back({g + "ffn_gate.weight", h + "mlp.gate_proj.weight", kFf, kD, 1});
    t.push_back({g + "ffn_up.weight", h + "mlp.up_proj.weight", kFf, kD, 0});
    t.push_back({g + "ffn_down.weight", h + "mlp.down_proj.weight", kD, kFf, l == 1 ? 7u : 1u});
  }
  return t;
}

std::vector<uint8_t> tiny_gguf() {
  GgufTestWriter w;
  w.add_string("general.architecture", "llama");
  w.add("llama.block_count", GgufValueType::u32, uint32_t{kLayers});
  w.add("llama.embedding_length", GgufValueType::u32, uint32_t{kD});
  w.add("llama.feed_forward_length", GgufValueType::u32, uint32_t{kFf});
  w.add("llama.attention.head_count", GgufValueType::u32, uint32_t{kHeads});
  w.add("llama.attention.head_count_kv", GgufValueType::u32, uint32_t{kKv});
  w.add("llama.context_length", GgufValueType::u32, uint32_t{64});
  w.add("llama.attention.layer_norm_rms_epsilon", GgufValueType::f32, 1e-5f);
  w.add("llama.vocab_size", GgufValueType::u32, uint32_t{kVocab});
  const std::vector<TinyTensor> tensors = tiny_tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TinyTensor& t = tensors[i];
    std::vector<uint64_t> shape = {static_cast<uint64_t>(t.cols)};
    if (t.rows > 1) shape.push_back(static_cast<uint64_t>(t.rows));
    w.add_tensor(t.gguf_name, shape, t.type_id, encode(t.type_id, static_cast<int>(i), t.rows, t.cols));
  }
  return w.bytes();
}

// Every matrix of `w` holds the expected slice of the value function.
void expect_tiny_values(const ModelWeights& w) {
  const std::vector<TinyTensor> tensors = tiny_tensors();
  auto check = [&](const WeightMatrix& m, const std::string& gguf_name, int64_t row0, int64_t col0) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].gguf_name != gguf_name) continue;
      ASSERT_NE(m.data, nullptr) << gguf_name;
      for (int64_t r = 0; r < m.rows; ++r) {
        for (int64_t c = 0; c < m.cols; ++c) {
          ASSERT_EQ(at(m, r, c), value(static_cast<int>(i), row0 + r, col0 + c)) << gguf_name << " " << r << "," << c;
        }
      }
      return;
    }
    FAIL() << "no tensor " << gguf_name;
  };
  const int64_t r = w.shard.tp_rank, tp = w.shard.tp_size;
  if (w.token_embd.data) check(w.token_embd, "token_embd.weight", 0, 0);
  if (w.shard.has_output) {
    check(w.output_norm, "output_norm.weight", 0, 0);
    check(w.output, "output.weight", w.output_vocab_begin, 0);
    EXPECT_EQ(w.output_vocab_begin, r * kVocab / tp);
  }
  for (const LayerWeights& L : w.layers) {
    const std::string g = "blk." + std::to_string(L.layer) + ".";
    check(L.attn_norm, g + "attn_norm.weight", 0, 0);
    check(L.wq, g + "attn_q.weight", r * kHeads / tp * kHeadDim, 0);
    check(L.wk, g + "attn_k.weight", r * kKv / tp * kHeadDim, 0);
    check(L.wv, g + "attn_v.weight", r * kKv / tp * kHeadDim, 0);
    check(L.wo, g + "attn_output.weight", 0, r * kHeads / tp * kHeadDim);
    check(L.ffn_norm, g + "ffn_norm.weight", 0, 0);
    check(L.w_gate, g + "ffn_gate.weight", r * kFf / tp, 0);
    check(L.w_up, g + "ffn_up.weight", r * kFf / tp, 0);
    check(L.w_down, g + "ffn_down.weight", 0, r * kFf / tp);
  }
}

TEST(LoadGgufWeights, TinyModelEveryShard) {
  TempFile f(tiny_gguf());
  auto file = GgufFile::open(f.path());
  for (int tp : {1, 2}) {
    for (int rank = 0; rank < tp; ++rank) {
      ShardSpec shard;
      shard.tp_size = tp, shard.tp_rank = rank;
      const ModelWeights w = load_gguf_weights(file, shard, WeightDtype::f32);
      ASSERT_EQ(w.layers.size(), 2u);
      EXPECT_FALSE(w.config.tied_embeddings);
      expect_shape(w.layers[0].wq, kHeads * kHeadDim / tp, kD, "wq");
      expect_shape(w.layers[0].wo, kD, kHeads * kHeadDim / tp, "wo");  // q8_0 columns split inside a block
      expect_shape(w.layers[1].w_down, kD, kFf / tp, "w_down");
      expect_shape(w.output, kVocab / tp, kD, "output");
      expect_tiny_values(w);
    }
  }
  // F32 tensors with whole rows are used in place, in the mapping.
  const ModelWeights w = load_gguf_weights(file, ShardSpec{}, WeightDtype::f32);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(w.layers[0].attn_norm.data), file->tensor("blk.0.attn_norm.weight").data);
  EXPECT_EQ(w.keep_alive.get(), file.get());
}

// model.weight_dtype auto: matrices stay in their file's format where the kernels have one (here q8_0, f16), used
// in place when whole rows are taken; column slices that split a block become f32.
TEST(LoadGgufWeights, AutoKeepsTheFilesFormats) {
  TempFile f(tiny_gguf());
  auto file = GgufFile::open(f.path());
  const ModelWeights w = load_gguf_weights(file, ShardSpec{});
  EXPECT_EQ(w.output.format, WeightFormat::q8_0);
  EXPECT_EQ(w.output.data, file->tensor("output.weight").data);
  EXPECT_EQ(w.layers[0].wq.format, WeightFormat::q8_0);
  EXPECT_EQ(w.layers[0].wk.format, WeightFormat::f16);  // kept as it is, in place
  EXPECT_EQ(w.layers[0].wk.data, file->tensor("blk.0.attn_k.weight").data);
  EXPECT_EQ(w.layers[0].wv.format, WeightFormat::q8_0);  // q5_0 in the file: the same values (expect_tiny_values)
  EXPECT_EQ(w.layers[1].w_down.format, WeightFormat::q5_1);  // kept as it is
  EXPECT_EQ(w.layers[1].w_down.data, file->tensor("blk.1.ffn_down.weight").data);
  EXPECT_EQ(w.layers[0].ffn_norm.data, file->tensor("blk.0.ffn_norm.weight").data);
  expect_tiny_values(w);
  for (int rank = 0; rank < 2; ++rank) {
    ShardSpec s;
    s.tp_size = 2, s.tp_rank = rank;
    const ModelWeights part = load_gguf_weights(file, s);
    EXPECT_EQ(part.layers[1].wq.format, WeightFormat::q8_0);  // whole rows: in place, at this rank's first row
    EXPECT_EQ(part.layers[1].wq.data, file->tensor("blk.1.attn_q.weight").data + rank * 16 * 34);
    EXPECT_EQ(part.layers[1].wo.format, WeightFormat::f32);  // 16 of 32 columns: inside a q8_0 block
    expect_tiny_values(part);
  }
}

// model.weight_dtype q8_0: every matrix requantized (norms stay f32), each value within half a step of the file's.
TEST(LoadGgufWeights, Q8_0RequantizesEveryMatrix) {
  TempFile f(tiny_gguf());
  auto file = GgufFile::open(f.path());
  const ModelWeights w = load_gguf_weights(file, ShardSpec{}, WeightDtype::q8_0);
  const ModelWeights exact = load_gguf_weights(file, ShardSpec{}, WeightDtype::f32);
  EXPECT_EQ(w.layers[0].attn_norm.format, WeightFormat::f32);
  for (int l = 0; l < kLayers; ++l) {
    const LayerWeights& L = w.layer(l);
    const LayerWeights& E = exact.layer(l);
    const std::pair<const WeightMatrix*, const WeightMatrix*> pairs[] = {
        {&L.wq, &E.wq}, {&L.wk, &E.wk}, {&L.wv, &E.wv}, {&L.wo, &E.wo}, {&L.w_gate, &E.w_gate}, {&L.w_down, &E.w_down}};
    for (const auto& [q, e] : pairs) {
      ASSERT_EQ(q->format, WeightFormat::q8_0);
      for (int64_t r = 0; r < q->rows; ++r) {
        for (int64_t c = 0; c < q->cols; ++c) {
          // |value| <= 1 in every block: d = 1 / 127.
          ASSERT_NEAR(at(*q, r, c), at(*e, r, c), 0.5f / 127.0f * 1.001f) << "layer " << l << " " << r << "," << c;
        }
      }
    }
  }
}

// model.weight_dtype f16 and bf16: every matrix in that format, the tiny model's values (k / 8, |k| <= 8) exact in
// both; a TP rank's column slice that splits a Q8_0 block too; the norms stay f32.
TEST(LoadGgufWeights, F16AndBf16RoundEveryMatrix) {
  TempFile f(tiny_gguf());
  auto file = GgufFile::open(f.path());
  for (const WeightDtype dtype : {WeightDtype::f16, WeightDtype::bf16}) {
    const WeightFormat format = dtype == WeightDtype::f16 ? WeightFormat::f16 : WeightFormat::bf16;
    for (int tp : {1, 2}) {
      ShardSpec s;
      s.tp_size = tp, s.tp_rank = tp - 1;
      const ModelWeights w = load_gguf_weights(file, s, dtype);
      EXPECT_EQ(w.layers[0].attn_norm.format, WeightFormat::f32);
      EXPECT_EQ(w.output.format, format);
      for (const LayerWeights& L : w.layers) {
        for (const WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
          EXPECT_EQ(m->format, format) << "layer " << L.layer;
        }
      }
      expect_tiny_values(w);
    }
  }
  EXPECT_EQ(parse_weight_dtype("bf16"), WeightDtype::bf16);
  EXPECT_THROW(parse_weight_dtype("fp16"), std::invalid_argument);
}

TEST(LoadGgufWeights, PipelineStages) {
  TempFile f(tiny_gguf());
  auto file = GgufFile::open(f.path());
  ShardSpec first;
  first.layer_end = 1, first.has_output = false;
  const ModelWeights a = load_gguf_weights(file, first, WeightDtype::f32);
  ASSERT_EQ(a.layers.size(), 1u);
  EXPECT_EQ(a.layers[0].layer, 0);
  EXPECT_NE(a.token_embd.data, nullptr);
  EXPECT_EQ(a.output.data, nullptr);
  EXPECT_EQ(a.output_norm.data, nullptr);
  ShardSpec last;
  last.layer_begin = 1, last.has_embedding = false;
  const ModelWeights b = load_gguf_weights(file, last, WeightDtype::f32);
  ASSERT_EQ(b.layers.size(), 1u);
  EXPECT_EQ(b.layer(1).layer, 1);
  EXPECT_EQ(b.token_embd.data, nullptr);  // untied: the last stage needs only output.weight
  EXPECT_NE(b.output.data, nullptr);
  expect_tiny_values(a);
  expect_tiny_values(b);
}

TEST(LoadGgufWeights, InvalidShards) {
  TempFile f(tiny_gguf());
  auto file = GgufFile::open(f.path());
  auto expect_invalid = [&](ShardSpec s, const std::string& fragment) {
    try {
      load_gguf_weights(file, s, WeightDtype::f32);
      ADD_FAILURE() << "accepted a shard that should fail with " << fragment;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  ShardSpec s;
  s.tp_size = 3;
  expect_invalid(s, "n_heads 4 is not divisible by tp_size 3");
  s.tp_size = 4;
  expect_invalid(s, "n_kv_heads 2 is not divisible by tp_size 4");
  s = ShardSpec{};
  s.layer_end = 3;
  expect_invalid(s, "layers [0, 3)");
  s = ShardSpec{};
  s.tp_rank = 2, s.tp_size = 2;
  expect_invalid(s, "tp_rank 2");
}

void write_tiny_hf_dir(const std::filesystem::path& dir) {
  write_text(dir / "config.json", R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 16,
      "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})");
  // Two shard files, like the multi-file checkpoints of large models.
  SafetensorsTestWriter files[2];
  const std::vector<TinyTensor> tensors = tiny_tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TinyTensor& t = tensors[i];
    const uint32_t type_id = t.type_id == 8 || t.type_id == 6 || t.type_id == 7 ? 30 : t.type_id;
    const char* dtype = type_id == 0 ? "F32" : type_id == 1 ? "F16" : "BF16";
    std::vector<int64_t> shape = {t.rows, t.cols};
    if (t.rows == 1) shape = {t.cols};
    files[i % 2].add(t.hf_name, dtype, shape, encode(type_id, static_cast<int>(i), t.rows, t.cols));
  }
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint8_t> bytes = files[i].bytes();
    std::ofstream(dir / ("model-0000" + std::to_string(i + 1) + "-of-00002.safetensors"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

TEST(LoadSafetensorsWeights, TinyModelEveryShard) {
  test::TempDir dir;
  write_tiny_hf_dir(dir.path());
  for (int tp : {1, 2}) {
    for (int rank = 0; rank < tp; ++rank) {
      ShardSpec shard;
      shard.tp_size = tp, shard.tp_rank = rank;
      const ModelWeights w = load_safetensors_weights(dir.path().string(), shard, WeightDtype::f32);
      EXPECT_EQ(w.config.rope_style, RopeStyle::half_split);
      ASSERT_EQ(w.layers.size(), 2u);
      expect_tiny_values(w);
    }
  }
}

// BF16 and F16 stay as they are under auto (wq is BF16 in the files, wk F16), also in a TP rank's column slice (wo
// is BF16); f16 converts the BF16 ones; q8_0 requantizes them.
TEST(LoadSafetensorsWeights, WeightDtypes) {
  test::TempDir dir;
  write_tiny_hf_dir(dir.path());
  const ModelWeights automatic = load_safetensors_weights(dir.path().string(), ShardSpec{});
  EXPECT_EQ(automatic.layers[0].wq.format, WeightFormat::bf16);
  EXPECT_EQ(automatic.layers[0].wk.format, WeightFormat::f16);
  expect_tiny_values(automatic);
  ShardSpec rank_1;
  rank_1.tp_size = 2, rank_1.tp_rank = 1;
  const ModelWeights part = load_safetensors_weights(dir.path().string(), rank_1);
  EXPECT_EQ(part.layers[0].wo.format, WeightFormat::bf16);
  EXPECT_EQ(part.layers[0].wo.cols, kD / 2);
  expect_tiny_values(part);
  const ModelWeights f16 = load_safetensors_weights(dir.path().string(), ShardSpec{}, WeightDtype::f16);
  EXPECT_EQ(f16.layers[0].wq.format, WeightFormat::f16);  // BF16 in the files: k / 8 is exact in both
  expect_tiny_values(f16);
  const ModelWeights q8 = load_safetensors_weights(dir.path().string(), ShardSpec{}, WeightDtype::q8_0);
  EXPECT_EQ(q8.layers[0].wq.format, WeightFormat::q8_0);
  EXPECT_EQ(q8.output.format, WeightFormat::q8_0);
  EXPECT_NEAR(at(q8.layers[0].wq, 3, 5), value(4, 3, 5), 0.5f / 127.0f * 1.001f);  // wq is tiny tensor 4
}

TEST(LoadSafetensorsWeights, MissingTensorIsNamed) {
  test::TempDir dir;
  write_tiny_hf_dir(dir.path());
  std::filesystem::remove(dir.path() / "model-00002-of-00002.safetensors");
  try {
    load_safetensors_weights(dir.path().string(), ShardSpec{}, WeightDtype::f32);
    ADD_FAILURE() << "loaded with half the tensors missing";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("is missing"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Dummy weights

TEST(MakeDummyWeights, DeterministicAndShardable) {
  ModelConfig c = preset_config("smollm2-135m");
  c.tied_embeddings = false;  // so that the TP ranks below need only their slice of the output head
  ShardSpec two_layers;
  two_layers.layer_end = 2;
  const ModelWeights a = make_dummy_weights(c, two_layers, 7);
  ShardSpec layer_1;
  layer_1.layer_begin = 1, layer_1.layer_end = 2, layer_1.has_embedding = false, layer_1.has_output = false;
  const ModelWeights b = make_dummy_weights(c, layer_1, 7);
  const ModelWeights other = make_dummy_weights(c, layer_1, 8);
  expect_sub_matrix(b.layer(1).w_down, a.layer(1).w_down, 0, 0, "same seed");
  EXPECT_NE(at(a.layer(1).w_down, 0, 0), at(other.layer(1).w_down, 0, 0));
  EXPECT_NE(at(a.layer(0).wq, 0, 0), at(a.layer(1).wq, 0, 0));  // seeded per tensor name
  EXPECT_NE(at(a.output, 0, 0), at(a.token_embd, 0, 0));
  for (int64_t i = 0; i < a.layers[0].attn_norm.size(); ++i) ASSERT_EQ(a.layers[0].attn_norm.f32()[i], 1.0f);

  double sum = 0, sum_sq = 0;
  const WeightMatrix& m = a.layers[0].w_gate;
  for (int64_t i = 0; i < m.size(); ++i) sum += m.f32()[i], sum_sq += double{m.f32()[i]} * m.f32()[i];
  const double mean = sum / static_cast<double>(m.size());
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(m.size()) - mean * mean), 0.02, 1e-3);

  for (int rank = 0; rank < 3; ++rank) {
    ShardSpec s = layer_1;
    s.has_output = true, s.tp_size = 3, s.tp_rank = rank;
    const ModelWeights w = make_dummy_weights(c, s, 7);
    EXPECT_EQ(w.token_embd.data, nullptr);
    expect_sub_matrix(w.layer(1).wq, a.layer(1).wq, rank * 192, 0, "wq");
    expect_sub_matrix(w.layer(1).wk, a.layer(1).wk, rank * 64, 0, "wk");
    expect_sub_matrix(w.layer(1).wo, a.layer(1).wo, 0, rank * 192, "wo");
    expect_sub_matrix(w.layer(1).w_down, a.layer(1).w_down, 0, rank * 512, "w_down");
    expect_sub_matrix(w.output, a.output, rank * 16384, 0, "output");
  }
}

TEST(MakeDummyWeights, TiedOutputAliasesTheEmbedding) {
  ShardSpec no_layers;
  no_layers.layer_end = 0;
  const ModelWeights w = make_dummy_weights(preset_config("smollm2-135m"), no_layers, 7);
  EXPECT_TRUE(w.layers.empty());
  EXPECT_EQ(w.output.data, w.token_embd.data);
  expect_shape(w.output, 49152, 576, "output");
}

TEST(MakeDummyWeights, LayersOfBenchmarkShapesShareLayerZerosMatrices) {
  ModelConfig c = preset_config("llama-3-8b@layers=3");
  c.vocab_size = 64;  // the layers are what is shared; a small vocabulary keeps the test light
  ShardSpec s;
  s.layer_begin = 1, s.has_embedding = false, s.has_output = false, s.tp_size = 4, s.tp_rank = 1;
  const ModelWeights w = make_dummy_weights(c, s, 3);
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.layer(1).w_down.data, w.layer(2).w_down.data);
  EXPECT_EQ(w.layer(1).wq.data, w.layer(2).wq.data);
  EXPECT_EQ(w.owned.size(), 9u);  // one layer's matrices, norms included
  ShardSpec first = s;
  first.layer_begin = 0, first.layer_end = 1;
  expect_sub_matrix(w.layer(2).wk, make_dummy_weights(c, first, 3).layer(0).wk, 0, 0, "wk of layer 0");
}

TEST(MakeDummyWeights, OneLayerOfLlama70BShapes) {
  const ModelConfig c = preset_config("llama-3-70b");
  ShardSpec s;
  s.layer_begin = 79, s.layer_end = 80, s.has_embedding = false, s.has_output = false;
  s.tp_size = 8, s.tp_rank = 5;
  const ModelWeights w = make_dummy_weights(c, s, 1);
  ASSERT_EQ(w.layers.size(), 1u);
  const LayerWeights& L = w.layer(79);
  expect_shape(L.wq, 8 * 128, 8192, "wq");
  expect_shape(L.wk, 128, 8192, "wk");
  expect_shape(L.wv, 128, 8192, "wv");
  expect_shape(L.wo, 8192, 8 * 128, "wo");
  expect_shape(L.w_gate, 3584, 8192, "w_gate");
  expect_shape(L.w_down, 8192, 3584, "w_down");
  EXPECT_EQ(w.token_embd.data, nullptr);
  EXPECT_EQ(w.output.data, nullptr);
  int64_t total = 0;  // nothing but this rank's slice of one layer was allocated
  for (const WeightMatrix* m : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down}) {
    total += m->size();
  }
  EXPECT_EQ(total, 855638016 / 8 + 2 * 8192);
}

// ---------------------------------------------------------------------------------------------------------------
// The real model

class RealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = GgufFile::open(test::smollm2_gguf_path());
    full_ = std::make_unique<ModelWeights>(load_gguf_weights(file_, ShardSpec{}, WeightDtype::f32));
  }
  static void TearDownTestSuite() {
    full_.reset();
    file_.reset();
  }
  static std::shared_ptr<GgufFile> file_;
  static std::unique_ptr<ModelWeights> full_;
};
std::shared_ptr<GgufFile> RealModel::file_;
std::unique_ptr<ModelWeights> RealModel::full_;

TEST_F(RealModel, Config) {
  const ModelConfig c = config_from_gguf(*file_);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.d_model, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope_style, RopeStyle::interleaved);
  EXPECT_EQ(c.rope_scaling.factor, 0.0f);
  EXPECT_EQ(c.group_size(), 3);
}

TEST_F(RealModel, TypeHistogram) {
  EXPECT_EQ(gguf_type_histogram(*file_), "272 tensors: 210 q4_1, 61 f32, 1 q8_0");
}

TEST_F(RealModel, ShapesOfTheFullLoad) {
  const ModelWeights& w = *full_;
  ASSERT_EQ(w.layers.size(), 30u);
  expect_shape(w.token_embd, 49152, 576, "token_embd");
  EXPECT_EQ(w.output.data, w.token_embd.data);  // tied
  expect_shape(w.output, 49152, 576, "output");
  expect_shape(w.output_norm, 1, 576, "output_norm");
  const LayerWeights& L = w.layer(29);
  expect_shape(L.wq, 576, 576, "wq");
  expect_shape(L.wk, 192, 576, "wk");
  expect_shape(L.wv, 192, 576, "wv");
  expect_shape(L.wo, 576, 576, "wo");
  expect_shape(L.w_gate, 1536, 576, "w_gate");
  expect_shape(L.w_up, 1536, 576, "w_up");
  expect_shape(L.w_down, 576, 1536, "w_down");
  expect_shape(L.attn_norm, 1, 576, "attn_norm");
  // Norms are F32 in the file: used in place.
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(L.ffn_norm.data), file_->tensor("blk.29.ffn_norm.weight").data);
}

TEST_F(RealModel, RowsMatchGgufPy) {
  std::ifstream in(test::source_path("tests/fixtures/dequant/smollm2_reference.json"));
  ASSERT_TRUE(in) << "tests/fixtures/dequant/smollm2_reference.json is missing: tools/make_dequant_fixtures.py";
  const nlohmann::json reference = nlohmann::json::parse(in);
  const ModelWeights& w = *full_;
  const std::map<std::string, const WeightMatrix*> matrices = {
      {"blk.0.attn_q.weight", &w.layer(0).wq}, {"blk.0.attn_k.weight", &w.layer(0).wk},
      {"blk.29.ffn_down.weight", &w.layer(29).w_down}, {"token_embd.weight", &w.token_embd},
      {"blk.0.attn_norm.weight", &w.layer(0).attn_norm}};
  int checked = 0;
  for (const auto& [name, entry] : reference.items()) {
    ASSERT_TRUE(matrices.count(name)) << name;
    const WeightMatrix& m = *matrices.at(name);
    EXPECT_EQ(entry["type"].get<std::string>(), ggml_type_name(file_->tensor(name).type)) << name;
    for (const auto& [row, values] : entry["rows"].items()) {
      for (size_t c = 0; c < values.size(); ++c) {
        const float expected = values[c].get<float>();
        ASSERT_NEAR(at(m, std::stoll(row), static_cast<int64_t>(c)), expected, 1e-6f * std::fabs(expected))
            << name << " row " << row << " col " << c;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 2 * 576 + 64 + 2 * 64 + 2 * 64 + 16);
}

TEST_F(RealModel, PipelineSlicesEqualTheFullLoad) {
  ShardSpec middle;
  middle.layer_begin = 10, middle.layer_end = 12, middle.has_embedding = false, middle.has_output = false;
  const ModelWeights m = load_gguf_weights(file_, middle, WeightDtype::f32);
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_EQ(m.token_embd.data, nullptr);
  EXPECT_EQ(m.output.data, nullptr);
  EXPECT_EQ(m.output_norm.data, nullptr);
  for (int l = 10; l < 12; ++l) {
    expect_sub_matrix(m.layer(l).wq, full_->layer(l).wq, 0, 0, "wq");
    expect_sub_matrix(m.layer(l).w_down, full_->layer(l).w_down, 0, 0, "w_down");
    expect_sub_matrix(m.layer(l).attn_norm, full_->layer(l).attn_norm, 0, 0, "attn_norm");
  }
  ShardSpec last;
  last.layer_begin = 29, last.has_embedding = false;
  const ModelWeights l = load_gguf_weights(file_, last, WeightDtype::f32);
  ASSERT_EQ(l.layers.size(), 1u);
  // Tied: the last stage needs the embedding as its output head.
  expect_sub_matrix(l.output, full_->token_embd, 0, 0, "output");
  expect_sub_matrix(l.output_norm, full_->output_norm, 0, 0, "output_norm");
  expect_sub_matrix(l.layer(29).w_up, full_->layer(29).w_up, 0, 0, "w_up");
}

TEST_F(RealModel, TensorParallelSlicesEqualTheFullLoad) {
  for (int rank = 0; rank < 3; ++rank) {
    ShardSpec s;
    s.layer_begin = 28, s.tp_size = 3, s.tp_rank = rank;
    const ModelWeights w = load_gguf_weights(file_, s, WeightDtype::f32);
    ASSERT_EQ(w.layers.size(), 2u);
    EXPECT_EQ(w.output_vocab_begin, rank * 16384);
    expect_shape(w.output, 16384, 576, "output");
    expect_sub_matrix(w.output, full_->token_embd, rank * 16384, 0, "output");
    for (int l = 28; l < 30; ++l) {
      const LayerWeights& part = w.layer(l);
      const LayerWeights& whole = full_->layer(l);
      expect_shape(part.wq, 192, 576, "wq");
      expect_shape(part.wk, 64, 576, "wk");
      expect_shape(part.wo, 576, 192, "wo");
      expect_shape(part.w_gate, 512, 576, "w_gate");
      expect_shape(part.w_down, 576, 512, "w_down");
      expect_sub_matrix(part.wq, whole.wq, rank * 192, 0, "wq");  // query heads [3r, 3r + 3)
      expect_sub_matrix(part.wk, whole.wk, rank * 64, 0, "wk");   // kv head r
      expect_sub_matrix(part.wv, whole.wv, rank * 64, 0, "wv");
      expect_sub_matrix(part.wo, whole.wo, 0, rank * 192, "wo");
      expect_sub_matrix(part.w_gate, whole.w_gate, rank * 512, 0, "w_gate");
      expect_sub_matrix(part.w_up, whole.w_up, rank * 512, 0, "w_up");
      expect_sub_matrix(part.w_down, whole.w_down, 0, rank * 512, "w_down");
      expect_sub_matrix(part.attn_norm, whole.attn_norm, 0, 0, "attn_norm");
    }
  }
  ShardSpec bad;
  bad.tp_size = 2;
  EXPECT_THROW(load_gguf_weights(file_, bad, WeightDtype::f32), std::invalid_argument);  // 9 heads
}

// The default load keeps the file's Q4_1 and Q8_0 blocks in place in the mapping: no copy, and at most 120 MB of
// weights for the whole model (the [cpu-speed] goal). Slices under tensor parallelism keep them too.
TEST_F(RealModel, AutoKeepsTheQuantizedBlocksInPlace) {
  const ModelWeights w = load_gguf_weights(file_, ShardSpec{});
  EXPECT_EQ(w.token_embd.format, WeightFormat::q8_0);
  EXPECT_EQ(w.token_embd.data, file_->tensor("token_embd.weight").data);
  EXPECT_EQ(w.output.data, w.token_embd.data);  // tied
  int64_t bytes = w.token_embd.bytes() + w.output_norm.bytes();
  for (const LayerWeights& L : w.layers) {
    EXPECT_EQ(L.wq.format, WeightFormat::q4_1);
    EXPECT_EQ(L.wq.data, file_->tensor("blk." + std::to_string(L.layer) + ".attn_q.weight").data);
    for (const WeightMatrix* m : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down}) {
      bytes += m->bytes();
    }
  }
  std::cout << "[ weights ] SmolLM2 under auto: " << bytes << " bytes" << std::endl;
  EXPECT_LE(bytes, 120'000'000);

  ShardSpec s;
  s.layer_begin = 29, s.tp_size = 3, s.tp_rank = 2;
  const ModelWeights part = load_gguf_weights(file_, s);
  const LayerWeights& L = part.layer(29);
  ASSERT_EQ(L.wo.format, WeightFormat::q4_1);  // 192 of 576 columns: whole blocks of 32, copied per row
  for (int64_t r : {0, 300, 575}) {
    for (int64_t c : {0, 31, 32, 191}) EXPECT_EQ(at(L.wo, r, c), at(full_->layer(29).wo, r, 2 * 192 + c));
  }
  EXPECT_EQ(L.w_gate.data, file_->tensor("blk.29.ffn_gate.weight").data + 2 * 512 * (576 / 32 * 20));
}

// tools/gguf_to_hf.py (gguf-py dequantization, Q/K un-permuted to HF layout) against the GGUF load.
TEST_F(RealModel, SafetensorsFromGgufToHfMatch) {
  test::TempDir dir;
  const std::string command = "cd '" + test::source_path("") + "' && .venv/bin/python tools/gguf_to_hf.py '" +
                              test::smollm2_gguf_path() + "' '" + dir.path().string() + "' --layers 2 > '" +
                              (dir.path() / "log.txt").string() + "' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed (is .venv set up? run tools/setup.sh)";
  ShardSpec s;
  s.layer_end = 2;
  const ModelWeights hf = load_safetensors_weights(dir.path().string(), s, WeightDtype::f32);
  EXPECT_EQ(hf.config.n_layers, 2);
  EXPECT_EQ(hf.config.rope_style, RopeStyle::half_split);
  EXPECT_EQ(hf.config.d_model, full_->config.d_model);
  EXPECT_EQ(hf.config.head_dim, full_->config.head_dim);
  EXPECT_EQ(hf.config.rms_eps, full_->config.rms_eps);
  EXPECT_EQ(hf.config.rope_theta, full_->config.rope_theta);
  EXPECT_TRUE(hf.config.tied_embeddings);

  auto expect_close = [](const WeightMatrix& a, const WeightMatrix& b, const std::string& what) {
    ASSERT_EQ(a.rows, b.rows) << what;
    ASSERT_EQ(a.cols, b.cols) << what;
    for (int64_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a.f32()[i], b.f32()[i], 1e-6f * std::fabs(b.f32()[i])) << what << " at " << i;
    }
  };
  // HF row h*d + j*(d/2) + i is GGUF row h*d + 2i + j.
  auto expect_unpermuted = [](const WeightMatrix& hf_rows, const WeightMatrix& gguf_rows, int head_dim,
                              const std::string& what) {
    ASSERT_EQ(hf_rows.rows, gguf_rows.rows) << what;
    for (int64_t h = 0; h < hf_rows.rows / head_dim; ++h) {
      for (int j = 0; j < 2; ++j) {
        for (int i = 0; i < head_dim / 2; ++i) {
          const int64_t hf_row = h * head_dim + j * (head_dim / 2) + i, gguf_row = h * head_dim + 2 * i + j;
          for (int64_t c = 0; c < hf_rows.cols; ++c) {
            const float expected = at(gguf_rows, gguf_row, c);
            ASSERT_NEAR(at(hf_rows, hf_row, c), expected, 1e-6f * std::fabs(expected))
                << what << " HF row " << hf_row;
          }
        }
      }
    }
  };
  expect_close(hf.token_embd, full_->token_embd, "token_embd");
  expect_close(hf.output_norm, full_->output_norm, "output_norm");
  for (int l = 0; l < 2; ++l) {
    const LayerWeights& a = hf.layer(l);
    const LayerWeights& b = full_->layer(l);
    expect_unpermuted(a.wq, b.wq, 64, "wq");
    expect_unpermuted(a.wk, b.wk, 64, "wk");
    expect_close(a.wv, b.wv, "wv");
    expect_close(a.wo, b.wo, "wo");
    expect_close(a.w_gate, b.w_gate, "w_gate");
    expect_close(a.w_up, b.w_up, "w_up");
    expect_close(a.w_down, b.w_down, "w_down");
    expect_close(a.attn_norm, b.attn_norm, "attn_norm");
    expect_close(a.ffn_norm, b.ffn_norm, "ffn_norm");
  }
  // The permutation is not the identity: the raw rows differ.
  EXPECT_NE(std::memcmp(hf.layer(0).wq.f32() + 576, full_->layer(0).wq.f32() + 576, 576 * sizeof(float)), 0);
}

}  // namespace
}  // namespace strata
