#include "model/model_loader.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/safetensors_file.h"

namespace strata {

namespace {

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// ---------------------------------------------------------------------------------------------------------------
// Configuration

int positive_int(int64_t v, const std::string& key, const std::string& path) {
  if (v <= 0 || v > INT_MAX) {
    throw GgufError(path + ": metadata key '" + key + "' = " + std::to_string(v) + " is out of range");
  }
  return static_cast<int>(v);
}

// Checks that hold for every source of a config.
void validate_config(const ModelConfig& c, const std::string& origin) {
  auto fail = [&](const std::string& what) { throw std::runtime_error(origin + ": " + what); };
  if (c.n_heads % c.n_kv_heads != 0) {
    fail("n_heads " + std::to_string(c.n_heads) + " is not a multiple of n_kv_heads " + std::to_string(c.n_kv_heads));
  }
  if (c.head_dim % 2 != 0) fail("head_dim " + std::to_string(c.head_dim) + " is odd; RoPE needs pairs");
}

}  // namespace

namespace {

// The metadata keys of one GGUF architecture ("llama." + suffix), read as the config needs them.
class GgufArchitectureKeys {
 public:
  GgufArchitectureKeys(const GgufFile& file, const std::string& arch) : file_(file), prefix_(arch + ".") {}

  std::string key(const std::string& suffix) const { return prefix_ + suffix; }
  GgufError missing(const std::string& key) const {
    return GgufError(file_.path() + ": missing metadata key '" + key + "'");
  }
  std::optional<int> optional_int(const std::string& suffix) const {
    std::optional<int64_t> v = file_.get_int(key(suffix));
    if (!v) return std::nullopt;
    return positive_int(*v, key(suffix), file_.path());
  }
  int required_int(const std::string& suffix) const {
    std::optional<int> v = optional_int(suffix);
    if (!v) throw missing(key(suffix));
    return *v;
  }
  float required_float(const std::string& suffix) const {
    std::optional<double> v = file_.get_float(key(suffix));
    if (!v) throw missing(key(suffix));
    return static_cast<float>(*v);
  }

 private:
  const GgufFile& file_;
  std::string prefix_;
};

// The head dimension; throws unless values, keys and RoPE all use it whole, without scaling or frequency factors.
int gguf_head_dim(const GgufFile& file, const GgufArchitectureKeys& keys, const ModelConfig& c) {
  const std::string& path = file.path();
  int head_dim = 0;
  if (std::optional<int> key_length = keys.optional_int("attention.key_length")) {
    head_dim = *key_length;
  } else {
    if (c.d_model % c.n_heads != 0) {
      throw GgufError(path + ": " + keys.key("embedding_length") + " " + std::to_string(c.d_model) +
                      " is not a multiple of the head count and " + keys.key("attention.key_length") + " is absent");
    }
    head_dim = c.d_model / c.n_heads;
  }
  std::optional<int> value_length = keys.optional_int("attention.value_length");
  if (value_length && *value_length != head_dim) {
    throw GgufError(path + ": " + keys.key("attention.value_length") + " " + std::to_string(*value_length) +
                    " differs from the key length " + std::to_string(head_dim) + ": not supported");
  }
  std::optional<int> rope_dims = keys.optional_int("rope.dimension_count");
  if (rope_dims && *rope_dims != head_dim) {
    throw GgufError(path + ": " + keys.key("rope.dimension_count") + " " + std::to_string(*rope_dims) +
                    " differs from the head dimension " + std::to_string(head_dim) +
                    ": partial RoPE is not supported");
  }
  std::optional<std::string> scaling = file.get_string(keys.key("rope.scaling.type"));
  if (scaling && *scaling != "none") {
    throw GgufError(path + ": " + keys.key("rope.scaling.type") + " '" + *scaling + "' is not supported");
  }
  if (file.find_tensor("rope_freqs.weight") != nullptr) {
    throw GgufError(path + ": tensor 'rope_freqs.weight' (Llama 3.1 RoPE frequency factors) is not supported");
  }
  return head_dim;
}

// The vocabulary size: the metadata key, else the tokenizer's token count, else the embedding's rows.
int gguf_vocab_size(const GgufFile& file, const GgufArchitectureKeys& keys) {
  const std::string& path = file.path();
  if (std::optional<int> vocab = keys.optional_int("vocab_size")) return *vocab;
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
      tokens != nullptr && tokens->type == GgufValueType::array && tokens->array_count > 0) {
    return positive_int(static_cast<int64_t>(tokens->array_count), "tokenizer.ggml.tokens (length)", path);
  }
  if (const GgufTensorInfo* embd = file.find_tensor("token_embd.weight"); embd && embd->shape.size() == 2) {
    return positive_int(embd->shape[1], "token_embd.weight ne[1]", path);
  }
  throw GgufError(path + ": cannot tell the vocabulary size: no " + keys.key("vocab_size") +
                  ", tokenizer.ggml.tokens or token_embd.weight");
}

}  // namespace

ModelConfig config_from_gguf(const GgufFile& file) {
  const std::string& path = file.path();
  const std::string arch = file.get_string("general.architecture").value_or("");
  if (arch.empty()) throw GgufError(path + ": missing metadata key 'general.architecture'");
  // Other GGUF architectures (qwen2, phi3, ...) use NEOX RoPE without the Q/K permutation: not this loader.
  if (arch != "llama") {
    throw GgufError(path + ": general.architecture is '" + arch + "'; only 'llama' is supported");
  }
  const GgufArchitectureKeys keys(file, arch);
  ModelConfig c;
  c.architecture = arch;
  c.name = file.get_string("general.name").value_or(std::filesystem::path(path).stem().string());
  c.n_layers = keys.required_int("block_count");
  c.d_model = keys.required_int("embedding_length");
  c.d_ff = keys.required_int("feed_forward_length");
  c.n_heads = keys.required_int("attention.head_count");
  c.n_kv_heads = keys.optional_int("attention.head_count_kv").value_or(c.n_heads);
  c.max_context = keys.required_int("context_length");
  c.rms_eps = keys.required_float("attention.layer_norm_rms_epsilon");
  c.rope_theta = static_cast<float>(file.get_float(keys.key("rope.freq_base")).value_or(10000.0));
  c.rope_style = RopeStyle::interleaved;
  c.head_dim = gguf_head_dim(file, keys, c);
  c.vocab_size = gguf_vocab_size(file, keys);
  c.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  validate_config(c, path);
  return c;
}

namespace {

// The keys of a Hugging Face config.json, read as the config needs them; errors name the file and the key.
class HfConfigKeys {
 public:
  explicit HfConfigKeys(std::string path) : path_(std::move(path)) {}

  std::runtime_error fail(const std::string& key, const std::string& what) const {
    return std::runtime_error(path_ + ": key '" + key + "' " + what);
  }
  // JSON null counts as absent (config.json writes "head_dim": null, "rope_scaling": null).
  static bool present(const nlohmann::json& obj, const std::string& key) {
    return obj.contains(key) && !obj[key].is_null();
  }
  // shown: the key as errors name it (nested keys with their parent).
  std::optional<int> int_in(const nlohmann::json& obj, const std::string& key, const std::string& shown) const {
    if (!present(obj, key)) return std::nullopt;
    const auto& v = obj[key];
    if (!v.is_number_integer()) throw fail(shown, "must be an integer");
    const int64_t x = v.get<int64_t>();
    if (x <= 0 || x > INT_MAX) throw fail(shown, "= " + std::to_string(x) + " is out of range");
    return static_cast<int>(x);
  }
  std::optional<float> float_in(const nlohmann::json& obj, const std::string& key, const std::string& shown) const {
    if (!present(obj, key)) return std::nullopt;
    if (!obj[key].is_number()) throw fail(shown, "must be a number");
    return obj[key].get<float>();
  }
  int required_int(const nlohmann::json& obj, const std::string& key) const {
    std::optional<int> v = int_in(obj, key, key);
    if (!v) throw fail(key, "is missing");
    return *v;
  }

 private:
  std::string path_;
};

nlohmann::json read_json_object(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  return j;
}

// rope_scaling of config.json: Llama 3's frequency scaling, or none ("default").
RopeScaling hf_rope_scaling(const HfConfigKeys& keys, const nlohmann::json& rs) {
  if (!rs.is_object()) throw keys.fail("rope_scaling", "must be an object or null");
  const std::string type_key = rs.contains("rope_type") ? "rope_type" : "type";
  const std::string type = rs.contains(type_key) && rs[type_key].is_string() ? rs[type_key].get<std::string>() : "";
  RopeScaling scaling;
  if (type == "default") return scaling;
  if (type != "llama3") {
    throw keys.fail("rope_scaling." + type_key, "is '" + type + "'; only 'llama3' (or 'default') is supported");
  }
  auto required = [&](const std::string& key) {
    std::optional<float> v = keys.float_in(rs, key, "rope_scaling." + key);
    if (!v) throw keys.fail("rope_scaling." + key, "is missing");
    return *v;
  };
  scaling.factor = required("factor");
  scaling.low_freq_factor = required("low_freq_factor");
  scaling.high_freq_factor = required("high_freq_factor");
  std::optional<int> original =
      keys.int_in(rs, "original_max_position_embeddings", "rope_scaling.original_max_position_embeddings");
  if (!original) throw keys.fail("rope_scaling.original_max_position_embeddings", "is missing");
  scaling.original_context = *original;
  return scaling;
}

}  // namespace

ModelConfig config_from_hf_json(const std::string& config_json_path) {
  const std::string& path = config_json_path;
  const nlohmann::json j = read_json_object(path);
  const HfConfigKeys keys(path);
  const std::string model_type = keys.present(j, "model_type") && j["model_type"].is_string()
                                     ? j["model_type"].get<std::string>() : "";
  if (model_type != "llama" && model_type != "mistral") {
    throw keys.fail("model_type", "is '" + model_type + "'; expected 'llama' or 'mistral'");
  }
  ModelConfig c;
  c.architecture = "llama";
  c.name = keys.present(j, "_name_or_path") && j["_name_or_path"].is_string()
               ? j["_name_or_path"].get<std::string>()
               : std::filesystem::path(path).parent_path().filename().string();
  c.d_model = keys.required_int(j, "hidden_size");
  c.n_layers = keys.required_int(j, "num_hidden_layers");
  c.n_heads = keys.required_int(j, "num_attention_heads");
  c.d_ff = keys.required_int(j, "intermediate_size");
  c.vocab_size = keys.required_int(j, "vocab_size");
  c.n_kv_heads = keys.int_in(j, "num_key_value_heads", "num_key_value_heads").value_or(c.n_heads);
  c.max_context = keys.int_in(j, "max_position_embeddings", "max_position_embeddings").value_or(2048);
  c.rms_eps = keys.float_in(j, "rms_norm_eps", "rms_norm_eps").value_or(1e-6f);  // transformers' LlamaConfig defaults
  c.rope_theta = keys.float_in(j, "rope_theta", "rope_theta").value_or(10000.0f);
  if (std::optional<int> head_dim = keys.int_in(j, "head_dim", "head_dim")) {
    c.head_dim = *head_dim;
  } else {
    if (c.d_model % c.n_heads != 0) throw keys.fail("hidden_size", "is not a multiple of num_attention_heads");
    c.head_dim = c.d_model / c.n_heads;
  }
  if (keys.present(j, "tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean()) throw keys.fail("tie_word_embeddings", "must be a bool");
    c.tied_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  c.rope_style = RopeStyle::half_split;
  if (keys.present(j, "rope_scaling")) c.rope_scaling = hf_rope_scaling(keys, j["rope_scaling"]);
  validate_config(c, path);
  return c;
}

namespace {

// "layers=40" after a preset's '@': fewer layers than the preset has (benchmarks that fit one GPU).
void apply_preset_override(ModelConfig& c, std::string_view preset, std::string_view override_text) {
  const size_t eq = override_text.find('=');
  const std::string key(override_text.substr(0, eq));
  const std::string value(eq == std::string_view::npos ? "" : override_text.substr(eq + 1));
  const std::string where = "model preset '" + std::string(preset) + "': ";
  if (key != "layers") throw std::invalid_argument(where + "unknown key '" + key + "'; the only key is 'layers'");
  int layers = 0;
  size_t used = 0;
  try {
    layers = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || layers < 1 || layers > c.n_layers) {
    throw std::invalid_argument(where + "layers: '" + value + "' is not an integer from 1 to " +
                                std::to_string(c.n_layers));
  }
  c.n_layers = layers;
}

}  // namespace

ModelConfig preset_config(std::string_view spec) {
  const size_t at = spec.find('@');
  const std::string_view name = spec.substr(0, at);
  ModelConfig c;
  c.architecture = "llama";
  c.rope_style = RopeStyle::half_split;
  c.rms_eps = 1e-5f;
  if (name == "smollm2-135m") {
    c.name = "SmolLM2-135M";
    c.n_layers = 30, c.d_model = 576, c.n_heads = 9, c.n_kv_heads = 3, c.head_dim = 64, c.d_ff = 1536;
    c.vocab_size = 49152, c.max_context = 8192, c.rope_theta = 100000.0f, c.tied_embeddings = true;
  } else if (name == "llama-3-8b") {
    c.name = "Llama-3.1-8B";
    c.n_layers = 32, c.d_model = 4096, c.n_heads = 32, c.n_kv_heads = 8, c.head_dim = 128, c.d_ff = 14336;
    c.vocab_size = 128256, c.max_context = 131072, c.rope_theta = 500000.0f;
    c.rope_scaling = RopeScaling{8.0f, 1.0f, 4.0f, 8192};
  } else if (name == "llama-3-70b") {
    c.name = "Llama-3.1-70B";
    c.n_layers = 80, c.d_model = 8192, c.n_heads = 64, c.n_kv_heads = 8, c.head_dim = 128, c.d_ff = 28672;
    c.vocab_size = 128256, c.max_context = 131072, c.rope_theta = 500000.0f;
    c.rope_scaling = RopeScaling{8.0f, 1.0f, 4.0f, 8192};
  } else if (name == "tiny-gqa") {
    // Small enough for multi-rank CPU tests: heads, KV heads, d_ff and vocabulary divide by 2 and 4 (SmolLM2's
    // 9 and 3 heads do not).
    c.name = "tiny-gqa";
    c.n_layers = 6, c.d_model = 256, c.n_heads = 8, c.n_kv_heads = 4, c.head_dim = 32, c.d_ff = 768;
    c.vocab_size = 4096, c.max_context = 2048, c.rope_theta = 10000.0f;
  } else {
    throw std::invalid_argument("unknown model preset '" + std::string(name) +
                                "'; known presets: smollm2-135m, llama-3-8b, llama-3-70b, tiny-gqa");
  }
  if (at != std::string_view::npos) apply_preset_override(c, spec, spec.substr(at + 1));
  return c;
}

void validate_shard(const ModelConfig& c, const ShardSpec& s) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("invalid shard: " + what); };
  const int layer_end = s.resolved_layer_end(c);
  if (s.layer_begin < 0 || s.layer_begin > layer_end || layer_end > c.n_layers) {
    fail("layers [" + std::to_string(s.layer_begin) + ", " + std::to_string(layer_end) + ") are not inside [0, " +
         std::to_string(c.n_layers) + ")");
  }
  if (s.tp_size < 1 || s.tp_rank < 0 || s.tp_rank >= s.tp_size) {
    fail("tp_rank " + std::to_string(s.tp_rank) + " is not in [0, tp_size " + std::to_string(s.tp_size) + ")");
  }
  const std::pair<const char*, int> dims[] = {
      {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"d_ff", c.d_ff}, {"vocab_size", c.vocab_size}};
  for (const auto& [what, value] : dims) {
    if (value % s.tp_size != 0) {
      fail(std::string(what) + " " + std::to_string(value) + " is not divisible by tp_size " +
           std::to_string(s.tp_size));
    }
  }
}

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Shards

enum class Part { token_embd, attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down, output_norm, output };

std::string gguf_tensor_name(Part part, int layer) {
  const std::string blk = "blk." + std::to_string(layer) + ".";
  switch (part) {
    case Part::token_embd: return "token_embd.weight";
    case Part::attn_norm: return blk + "attn_norm.weight";
    case Part::wq: return blk + "attn_q.weight";
    case Part::wk: return blk + "attn_k.weight";
    case Part::wv: return blk + "attn_v.weight";
    case Part::wo: return blk + "attn_output.weight";
    case Part::ffn_norm: return blk + "ffn_norm.weight";
    case Part::w_gate: return blk + "ffn_gate.weight";
    case Part::w_up: return blk + "ffn_up.weight";
    case Part::w_down: return blk + "ffn_down.weight";
    case Part::output_norm: return "output_norm.weight";
    case Part::output: return "output.weight";
  }
  return "";
}

std::string hf_tensor_name(Part part, int layer) {
  const std::string blk = "model.layers." + std::to_string(layer) + ".";
  switch (part) {
    case Part::token_embd: return "model.embed_tokens.weight";
    case Part::attn_norm: return blk + "input_layernorm.weight";
    case Part::wq: return blk + "self_attn.q_proj.weight";
    case Part::wk: return blk + "self_attn.k_proj.weight";
    case Part::wv: return blk + "self_attn.v_proj.weight";
    case Part::wo: return blk + "self_attn.o_proj.weight";
    case Part::ffn_norm: return blk + "post_attention_layernorm.weight";
    case Part::w_gate: return blk + "mlp.gate_proj.weight";
    case Part::w_up: return blk + "mlp.up_proj.weight";
    case Part::w_down: return blk + "mlp.down_proj.weight";
    case Part::output_norm: return "model.norm.weight";
    case Part::output: return "lm_head.weight";
  }
  return "";
}

bool is_norm(Part part) { return part == Part::attn_norm || part == Part::ffn_norm || part == Part::output_norm; }

// The part of a full [rows, cols] tensor that a shard holds.
struct Slice {
  int64_t rows = 0, cols = 0;
  int64_t row_begin = 0, n_rows = 0;
  int64_t col_begin = 0, n_cols = 0;
};

using OwnedBuffers = std::vector<std::unique_ptr<uint8_t[]>>;
// Produces the slice of one tensor (layer = -1 for the tensors outside the layers).
using MatrixSource = std::function<WeightMatrix(Part part, int layer, const Slice& slice, OwnedBuffers& owned)>;

// A buffer of `bytes` owned by the weights (operator new[] aligns it for floats).
uint8_t* new_buffer(OwnedBuffers& owned, int64_t bytes) {
  owned.push_back(std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(bytes)));
  return owned.back().get();
}

// Decides which tensors and slices a shard holds; `source` reads or makes each one.
ModelWeights assemble_weights(const ModelConfig& c, const ShardSpec& s, const MatrixSource& source) {
  validate_shard(c, s);
  ModelWeights w;
  w.config = c;
  w.shard = s;
  w.shard.layer_end = s.resolved_layer_end(c);
  const int64_t tp = s.tp_size, r = s.tp_rank;
  const int64_t d = c.d_model, q_rows = int64_t{c.n_heads} * c.head_dim, kv_rows = int64_t{c.n_kv_heads} * c.head_dim;
  auto full = [](int64_t rows, int64_t cols) { return Slice{rows, cols, 0, rows, 0, cols}; };
  // Column-parallel: this rank's rows (whole heads, since rows / tp is a multiple of head_dim).
  auto rows_of_rank = [&](int64_t rows, int64_t cols) {
    return Slice{rows, cols, r * (rows / tp), rows / tp, 0, cols};
  };
  // Row-parallel: the matching columns.
  auto cols_of_rank = [&](int64_t rows, int64_t cols) {
    return Slice{rows, cols, 0, rows, r * (cols / tp), cols / tp};
  };
  auto load = [&](Part part, int layer, const Slice& slice) { return source(part, layer, slice, w.owned); };

  if (s.has_embedding || (c.tied_embeddings && s.has_output)) {
    w.token_embd = load(Part::token_embd, -1, full(c.vocab_size, d));
  }
  for (int l = s.layer_begin; l < w.shard.layer_end; ++l) {
    LayerWeights L;
    L.layer = l;
    L.attn_norm = load(Part::attn_norm, l, full(1, d));
    L.wq = load(Part::wq, l, rows_of_rank(q_rows, d));
    L.wk = load(Part::wk, l, rows_of_rank(kv_rows, d));
    L.wv = load(Part::wv, l, rows_of_rank(kv_rows, d));
    L.wo = load(Part::wo, l, cols_of_rank(d, q_rows));
    L.ffn_norm = load(Part::ffn_norm, l, full(1, d));
    L.w_gate = load(Part::w_gate, l, rows_of_rank(c.d_ff, d));
    L.w_up = load(Part::w_up, l, rows_of_rank(c.d_ff, d));
    L.w_down = load(Part::w_down, l, cols_of_rank(d, c.d_ff));
    w.layers.push_back(L);
  }
  if (s.has_output) {
    w.output_norm = load(Part::output_norm, -1, full(1, d));
    const Slice vocab = rows_of_rank(c.vocab_size, d);
    w.output_vocab_begin = vocab.row_begin;
    w.output = c.tied_embeddings ? WeightMatrix{w.token_embd.row(vocab.row_begin), w.token_embd.format, vocab.n_rows, d}
                                 : load(Part::output, -1, vocab);
  }
  return w;
}

// A tensor in a mapped file, seen as [rows, cols] with `cols` contiguous.
struct TensorView {
  std::string name;
  GgmlType type = GgmlType::f32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
};

// The covered values of a slice in fp32: only the rows and blocks the slice covers are dequantized. A column
// range may start or end inside a block: the covering blocks are dequantized and the wanted part copied.
void dequantize_slice(const TensorView& t, const GgmlTypeTraits& traits, const Slice& s, float* out) {
  const uint64_t row_bytes = ggml_row_bytes(t.type, t.cols);
  const int64_t block = traits.block_elements;
  const int64_t first_col = s.col_begin / block * block;
  const int64_t end_col = (s.col_begin + s.n_cols + block - 1) / block * block;
  const uint64_t skip_bytes = static_cast<uint64_t>(first_col / block) * traits.block_bytes;
  const bool block_aligned = first_col == s.col_begin && end_col == s.col_begin + s.n_cols;
  std::vector<float> covering(block_aligned ? 0 : static_cast<size_t>(end_col - first_col));
  for (int64_t i = 0; i < s.n_rows; ++i) {
    const uint8_t* src = t.data + (s.row_begin + i) * row_bytes + skip_bytes;
    float* dst = out + i * s.n_cols;
    if (block_aligned) {
      dequantize_row(t.type, src, dst, s.n_cols);
    } else {
      dequantize_row(t.type, src, covering.data(), end_col - first_col);
      std::copy_n(covering.data() + (s.col_begin - first_col), s.n_cols, dst);
    }
  }
}

// The format `dtype` asks of a matrix of n_cols columns whatever its source holds (norms are always f32); nullopt
// under auto, where the source decides.
std::optional<WeightFormat> requested_format(WeightDtype dtype, bool norm, int64_t n_cols) {
  if (norm) return WeightFormat::f32;
  switch (dtype) {
    case WeightDtype::f32: return WeightFormat::f32;
    case WeightDtype::q8_0: return n_cols % 32 == 0 ? WeightFormat::q8_0 : WeightFormat::f32;
    case WeightDtype::f16: return WeightFormat::f16;
    case WeightDtype::bf16: return WeightFormat::bf16;
    case WeightDtype::automatic: break;
  }
  return std::nullopt;
}

// The format a slice is kept in under `dtype` (norms, 1-D, are always f32). Q5_0 becomes Q8_0 under auto too: the
// same values exactly (q5_0_as_q8_0), at 34 bytes a block of 32 where f32 would take 128.
WeightFormat target_format(const TensorView& t, const Slice& s, WeightDtype dtype, bool norm) {
  if (const std::optional<WeightFormat> requested = requested_format(dtype, norm, s.n_cols)) return *requested;
  const std::optional<WeightFormat> own = t.type == GgmlType::q5_0 ? WeightFormat::q8_0 : weight_format_of(t.type);
  if (!own) return WeightFormat::f32;
  const int64_t block = weight_format_info(*own).block_elements;
  return s.col_begin % block == 0 && s.n_cols % block == 0 ? *own : WeightFormat::f32;
}

// [rows, cols] fp32 values requantized to Q8_0 (model.weight_dtype q8_0) or rounded to f16 or bf16.
WeightMatrix requantize_values(const float* values, int64_t rows, int64_t cols, WeightFormat format,
                               OwnedBuffers& owned) {
  WeightMatrix out{nullptr, format, rows, cols};
  uint8_t* dst = new_buffer(owned, out.bytes());
  for (int64_t i = 0; i < rows; ++i) {
    if (format == WeightFormat::q8_0) {
      quantize_row_q8_0(values + i * cols, dst + i * out.row_bytes(), cols);
    } else {
      round_row_to_half(format, values + i * cols, dst + i * out.row_bytes(), cols);
    }
  }
  out.data = dst;
  return out;
}

// Reads a slice in the format `dtype` asks for: in place when the file holds whole rows in that format, a copy of
// each row's blocks for a column slice of whole blocks, converted otherwise.
WeightMatrix read_slice(const TensorView& t, const Slice& s, WeightDtype dtype, bool norm, OwnedBuffers& owned) {
  if (t.rows != s.rows || t.cols != s.cols) {
    throw std::runtime_error("tensor '" + t.name + "' has shape [" + std::to_string(t.rows) + ", " +
                             std::to_string(t.cols) + "], expected [" + std::to_string(s.rows) + ", " +
                             std::to_string(s.cols) + "]");
  }
  const GgmlTypeTraits* traits = ggml_type_traits(static_cast<uint32_t>(t.type));
  if (traits == nullptr || !traits->supported) {
    throw std::runtime_error("tensor '" + t.name + "' has type " + std::string(ggml_type_name(t.type)) +
                             ", which cannot be dequantized");
  }
  const WeightFormat format = target_format(t, s, dtype, norm);
  const uint64_t row_bytes = ggml_row_bytes(t.type, t.cols);
  const uint8_t* first_row = t.data + s.row_begin * row_bytes;
  const bool whole_rows = s.col_begin == 0 && s.n_cols == s.cols;
  const bool aligned = format != WeightFormat::f32 || reinterpret_cast<uintptr_t>(first_row) % alignof(float) == 0;
  if (weight_format_of(t.type) == format && whole_rows && aligned) return WeightMatrix{first_row, format, s.n_rows, s.n_cols};

  WeightMatrix out{nullptr, format, s.n_rows, s.n_cols};
  if (weight_format_of(t.type) == format) {  // a column slice of whole blocks: copy each row's part
    const int64_t skip = s.col_begin / traits->block_elements * traits->block_bytes;
    uint8_t* dst = new_buffer(owned, out.bytes());
    for (int64_t i = 0; i < s.n_rows; ++i) {
      std::memcpy(dst + i * out.row_bytes(), first_row + i * row_bytes + skip, size_t(out.row_bytes()));
    }
    out.data = dst;
    return out;
  }
  if (format == WeightFormat::f32) {
    auto* dst = reinterpret_cast<float*>(new_buffer(owned, out.bytes()));
    dequantize_slice(t, *traits, s, dst);
    out.data = dst;
    return out;
  }
  // Q5_0 as Q8_0 in whole blocks (n_cols % 32 == 0: target_format)
  if (format == WeightFormat::q8_0 && t.type == GgmlType::q5_0 && s.col_begin % 32 == 0) {
    uint8_t* dst = new_buffer(owned, out.bytes());
    for (int64_t i = 0; i < s.n_rows; ++i) {
      q5_0_as_q8_0(first_row + i * row_bytes + s.col_begin / 32 * 22, dst + i * out.row_bytes(), s.n_cols / 32);
    }
    out.data = dst;
    return out;
  }
  std::vector<float> values(static_cast<size_t>(s.n_rows * s.n_cols));
  dequantize_slice(t, *traits, s, values.data());
  return requantize_values(values.data(), s.n_rows, s.n_cols, format, owned);
}

// ---------------------------------------------------------------------------------------------------------------
// Dummy weights: a counter-based generator, so that any slice can be made without the rest of the tensor.

uint64_t mix64(uint64_t z) {  // the splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001B3ull;
  return mix64(h ^ mix64(seed));
}

// The sum of four 16-bit uniforms (Irwin-Hall) is close to a normal; scaled to standard deviation 0.02.
float dummy_value(uint64_t key, uint64_t index) {
  const uint64_t z = mix64(key + index * 0x9E3779B97F4A7C15ull);
  const uint64_t sum = (z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48);
  constexpr double kScale = 0.02 * 1.7320508075688772 / 65536.0;  // sqrt(3): the sum has variance 4/12
  return static_cast<float>((static_cast<double>(sum) - 2.0 * 65535.0) * kScale);
}

// Under model.weight_dtype q8_0, f16 or bf16 the generated values are requantized; otherwise they stay fp32.
WeightMatrix make_dummy_slice(uint64_t key, bool norm, const Slice& s, WeightDtype dtype, OwnedBuffers& owned) {
  const int64_t n = s.n_rows * s.n_cols;
  const WeightFormat format = requested_format(dtype, norm, s.n_cols).value_or(WeightFormat::f32);
  const bool requantize = format != WeightFormat::f32;
  std::vector<float> scratch(requantize ? static_cast<size_t>(n) : 0);
  float* out = requantize ? scratch.data() : reinterpret_cast<float*>(new_buffer(owned, n * int64_t{sizeof(float)}));
  if (norm) {
    std::fill_n(out, n, 1.0f);
  } else {
    auto fill_rows = [&](int64_t row0, int64_t row1) {
      for (int64_t i = row0; i < row1; ++i) {
        const uint64_t base = static_cast<uint64_t>((s.row_begin + i) * s.cols + s.col_begin);
        float* row = out + i * s.n_cols;
        for (int64_t j = 0; j < s.n_cols; ++j) row[j] = dummy_value(key, base + static_cast<uint64_t>(j));
      }
    };
    // Benchmark shapes hold hundreds of millions of values: spread them over the cores.
    const int64_t n_threads = n < (int64_t{1} << 22) ? 1 : std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> threads;
    for (int64_t t = 1; t < n_threads; ++t) {
      threads.emplace_back(fill_rows, s.n_rows * t / n_threads, s.n_rows * (t + 1) / n_threads);
    }
    fill_rows(0, s.n_rows / n_threads);
    for (auto& th : threads) th.join();
  }
  if (requantize) return requantize_values(out, s.n_rows, s.n_cols, format, owned);
  return WeightMatrix{out, WeightFormat::f32, s.n_rows, s.n_cols};
}

std::string histogram_text(const std::map<std::string, int>& counts, size_t total) {
  std::vector<std::pair<std::string, int>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::ostringstream out;
  out << total << " tensors:";
  for (size_t i = 0; i < sorted.size(); ++i) out << (i ? ", " : " ") << sorted[i].second << " " << sorted[i].first;
  return out.str();
}

}  // namespace

std::string gguf_type_histogram(const GgufFile& file) {
  std::map<std::string, int> counts;
  for (const GgufTensorInfo& t : file.tensors()) ++counts[std::string(ggml_type_name(t.type))];
  return histogram_text(counts, file.tensors().size());
}

WeightDtype parse_weight_dtype(const std::string& name) {
  if (name == "auto") return WeightDtype::automatic;
  if (name == "f32") return WeightDtype::f32;
  if (name == "q8_0") return WeightDtype::q8_0;
  if (name == "f16") return WeightDtype::f16;
  if (name == "bf16") return WeightDtype::bf16;
  throw std::invalid_argument("'" + name + "' is not a weight dtype; expected auto, f32, q8_0, f16 or bf16");
}

ModelWeights load_gguf_weights(std::shared_ptr<GgufFile> file, const ShardSpec& shard, WeightDtype dtype) {
  const ModelConfig config = config_from_gguf(*file);
  std::cerr << file_name(file->path()) << ": " << gguf_type_histogram(*file) << "\n";
  const GgufFile& f = *file;
  ModelWeights w = assemble_weights(config, shard, [&](Part part, int layer, const Slice& s, OwnedBuffers& owned) {
    const GgufTensorInfo& t = f.tensor(gguf_tensor_name(part, layer));
    if (t.shape.size() > 2) {
      throw GgufError(f.path() + ": tensor '" + t.name + "' has " + std::to_string(t.shape.size()) +
                      " dimensions, expected at most 2");
    }
    try {
      return read_slice(TensorView{t.name, t.type, t.n_rows(), t.row_length(), t.data}, s, dtype, is_norm(part),
                        owned);
    } catch (const std::runtime_error& e) {
      throw GgufError(f.path() + ": " + e.what());
    }
  });
  w.keep_alive = std::move(file);
  return w;
}

ModelWeights load_safetensors_weights(const std::string& model_dir, const ShardSpec& shard, WeightDtype dtype) {
  const ModelConfig config = config_from_hf_json((std::filesystem::path(model_dir) / "config.json").string());
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(model_dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) throw std::runtime_error(model_dir + ": no *.safetensors files");

  auto files = std::make_shared<std::vector<std::shared_ptr<SafetensorsFile>>>();
  std::map<std::string, const SafetensorsTensor*, std::less<>> by_name;
  std::map<std::string, int> dtype_counts;
  for (const std::string& path : paths) {
    files->push_back(SafetensorsFile::open(path));
    for (const SafetensorsTensor& t : files->back()->tensors()) {
      if (!by_name.emplace(t.name, &t).second) {
        throw std::runtime_error(model_dir + ": tensor '" + t.name + "' appears in more than one file");
      }
      std::string dtype = t.dtype;
      std::transform(dtype.begin(), dtype.end(), dtype.begin(), [](unsigned char ch) { return std::tolower(ch); });
      ++dtype_counts[dtype];
    }
  }
  if (!config.tied_embeddings && shard.has_output && by_name.count("lm_head.weight") == 0) {
    throw std::runtime_error(model_dir + ": tensor 'lm_head.weight' is missing and tie_word_embeddings is false");
  }
  std::cerr << file_name(model_dir) << ": " << histogram_text(dtype_counts, by_name.size()) << "\n";

  ModelWeights w = assemble_weights(config, shard, [&](Part part, int layer, const Slice& s, OwnedBuffers& owned) {
    const std::string name = hf_tensor_name(part, layer);
    auto it = by_name.find(name);
    if (it == by_name.end()) throw std::runtime_error(model_dir + ": tensor '" + name + "' is missing");
    const SafetensorsTensor& t = *it->second;
    const std::optional<GgmlType> type = t.ggml_type();
    if (!type) {
      throw std::runtime_error(model_dir + ": tensor '" + name + "' has dtype " + t.dtype +
                               "; expected F32, F16 or BF16");
    }
    if (t.shape.empty() || t.shape.size() > 2) {
      throw std::runtime_error(model_dir + ": tensor '" + name + "' has " + std::to_string(t.shape.size()) +
                               " dimensions, expected 1 or 2");
    }
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
    try {
      return read_slice(TensorView{name, *type, rows, t.shape.back(), t.data}, s, dtype, is_norm(part), owned);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(model_dir + ": " + e.what());
    }
  });
  w.keep_alive = std::move(files);
  return w;
}

ModelWeights make_dummy_weights(const ModelConfig& config, const ShardSpec& shard, uint64_t seed, WeightDtype dtype) {
  const int64_t q_rows = int64_t{config.n_heads} * config.head_dim;
  const int64_t kv_rows = int64_t{config.n_kv_heads} * config.head_dim;
  const int64_t layer_parameters = int64_t{config.d_model} * (2 * q_rows + 2 * kv_rows + 3 * int64_t{config.d_ff});
  const bool shared = layer_parameters > kDummySharedLayerParameters;
  std::map<Part, WeightMatrix> first_layer;  // when shared: the matrices every layer points at
  return assemble_weights(config, shard, [&](Part part, int layer, const Slice& s, OwnedBuffers& owned) {
    if (!shared || layer < 0) {
      return make_dummy_slice(tensor_key(seed, gguf_tensor_name(part, layer)), is_norm(part), s, dtype, owned);
    }
    // Keyed by layer 0's names, so that every shard holds the same values as the whole model.
    auto [it, made] = first_layer.try_emplace(part);
    if (made) {
      it->second = make_dummy_slice(tensor_key(seed, gguf_tensor_name(part, 0)), is_norm(part), s, dtype, owned);
    }
    return it->second;
  });
}

}  // namespace strata
