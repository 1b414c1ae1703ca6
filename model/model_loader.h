#pragma once
// Builds a ModelConfig (from GGUF metadata, a Hugging Face config.json, or a named preset) and loads the weights
// of one rank's shard (from GGUF, from safetensors, or generated) into ModelWeights.
// ../shared/specs/model_format.md, sections 3-5 and 8.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "model/gguf_file.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace strata {

// Llama-architecture GGUF metadata. Integers of any width are accepted; RopeStyle::interleaved (the converter
// permuted the Q/K rows); tied_embeddings when output.weight is absent. GgufError naming the key when a required
// key is missing or out of range.
ModelConfig config_from_gguf(const GgufFile& file);

// A Hugging Face config.json of a Llama/Mistral model; RopeStyle::half_split. std::runtime_error naming the key
// and the file.
ModelConfig config_from_hf_json(const std::string& config_json_path);

// "smollm2-135m", "llama-3-8b" (Llama-3.1-8B, with llama3 rope scaling), "llama-3-70b" (Llama-3.1-70B, likewise),
// "tiny-gqa" (6 layers, 8 heads, 4 KV heads: multi-rank tests): shapes for dummy weights. "NAME@layers=L" keeps the
// first L layers (benchmarks of 70B layer shapes on one GPU: "llama-3-70b@layers=40").
// std::invalid_argument listing the known names, or naming the key `layers` and its range, otherwise.
ModelConfig preset_config(std::string_view spec);

// Checks a shard against a config: layer range inside the model, tp_rank < tp_size, and n_heads, n_kv_heads,
// d_ff and vocab_size divisible by tp_size. Throws std::invalid_argument saying which does not hold.
void validate_shard(const ModelConfig& config, const ShardSpec& shard);

// The weights of one shard (see ModelWeights for the slices), in the formats `dtype` asks for. GGUF rows keep the
// GGUF layout (interleaved RoPE); tensors kept in their file's format are used in place and the weights keep the
// file alive.
ModelWeights load_gguf_weights(std::shared_ptr<GgufFile> file, const ShardSpec& shard,
                               WeightDtype dtype = WeightDtype::automatic);

// A Hugging Face model directory: config.json plus one or more *.safetensors (F32, F16 or BF16), HF layout
// (half-split RoPE). F16 and BF16 stay as they are under auto, used in place (the CUDA backend makes bf16 of all).
ModelWeights load_safetensors_weights(const std::string& model_dir, const ShardSpec& shard,
                                      WeightDtype dtype = WeightDtype::automatic);

// Deterministic random weights for benchmarks: every value depends only on (seed, tensor name, row, column), so a
// shard holds exactly the corresponding slice of the full model; weights ~ N(0, 0.02^2) (approximately), norms 1.
// Only the shard's tensors are allocated. A model whose layers hold more than kDummySharedLayerParameters
// parameters (the 8B and 70B presets, not the tests' small ones) makes one layer's matrices, with layer 0's
// values, and every layer of the shard points at them: 70B layers take 3.4 GB each in fp32, so 40 distinct ones
// would not fit a GPU machine's host memory. A device backend still uploads each layer's copy (what is read per
// step does not change).
// With dtype q8_0 the values are requantized (8B and 70B shapes at Q8_0's bytes); otherwise they are f32.
constexpr int64_t kDummySharedLayerParameters = int64_t{1} << 26;
ModelWeights make_dummy_weights(const ModelConfig& config, const ShardSpec& shard, uint64_t seed,
                                WeightDtype dtype = WeightDtype::automatic);

// "272 tensors: 210 q4_1, 1 q8_0, 61 f32": tensor count per type, most frequent first (logged on load).
std::string gguf_type_histogram(const GgufFile& file);

}  // namespace strata
