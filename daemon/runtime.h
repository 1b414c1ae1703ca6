#pragma once
// Assembles a rank's parts (rank/rank_runtime.h) and the leader's engine from the configuration. Shared by
// `strata serve`, `generate`, `bench`, `eval` and `calibrate`, and by the tests that drive the engine in-process.
#include <memory>

#include "daemon/rank_world.h"
#include "daemon/server_config.h"
#include "leader/engine.h"
#include "leader/step_dispatcher.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "rank/rank_runtime.h"

namespace strata {

// Loads model.path: a .gguf file, a Hugging Face directory (config.json + *.safetensors + tokenizer.json), or
// "preset:<name>" (dummy weights at real shapes, no tokenizer). Throws with the file, key or offset at fault.
// world: this rank's place and communicators; null: a world of one (the whole model).
std::unique_ptr<RankRuntime> make_runtime(const ServerConfig& config, const RankWorld* world = nullptr);

// The leader's dispatcher over the runtime (every rank must be running, the others in run_worker): its
// constructor exchanges a first step with them.
std::unique_ptr<StepDispatcher> make_dispatcher(RankRuntime& rt, const RankWorld* world);

// What of model.path a router needs (strata route): the tokenizer, the chat template, the served name and the
// context, without the weights. Throws ConfigError naming model.path where the model has no tokenizer.
struct ModelFrontEnd {
  Tokenizer tokenizer;
  ChatTemplate chat_template;
  std::string model_name;
  int max_context = 0;
};
ModelFrontEnd load_model_front_end(const ServerConfig& config);

// For models without a tokenizer (dummy weights): token i is the text "t<i>", nothing is special.
Tokenizer stand_in_tokenizer(const ModelConfig& config);

// The KV pool's block layout under kv_cache.dtype, from the model's full-precision one on this backend: quantized
// blocks hold one KIVI group of 32 entries. ConfigError naming the key where the format cannot work or would save
// no memory (int8 in CUDA's bf16 blocks).
KvBlockLayout kv_pool_layout(const ServerConfig& config, KvBlockLayout full_precision);

// Bytes of the shard's weights as the backend holds them (Backend::uploaded_weight_bytes: bf16 on CUDA; the file's
// blocks or f16/bf16 values, or f32, on the CPU): every matrix of its layers (norms included), on the last stage
// the output norm and head, and with `embedding` the token embedding (a tied head counted once). Without it, what
// one decode step reads (a step reads only its batch's rows of the embedding).
int64_t held_weight_bytes(const ModelWeights& w, const Backend& backend, bool embedding);

// What the backend's matmuls multiply the weights with: engine.activation_dtype with auto decided for this machine
// (int16 on AVX-512 VNNI, else f32) on the CPU backend, "bf16" on CUDA. The start-up line and strata bench say it.
std::string activations_name(const ServerConfig& config);

// The server's compression policies (kv_cache.policy, kv_cache.layer_overrides, kv_cache.prefill_compression), and
// KVzip's reconstruction prompt in rt's tokens (none for a model without a tokenizer: a preset's chunk is repeated
// without the request).
CompressionConfig compression_config(const ServerConfig& config, const RankRuntime& rt);
// The engine's settings from the configuration; rt: the leader's runtime (the model's shape, for prefix caching).
EngineOptions engine_options(const ServerConfig& config, const RankRuntime& rt);

}  // namespace strata
