#pragma once
// Everything one rank needs to run the model, assembled from the configuration: the weights of its shard (its
// stage's layers, its tensor slice), the tokenizer and chat template, the backend, the KV pool and cache of its
// layers, the step executor, and, in a world of several ranks, the policies' collectives and the step exchange.
// Shared by `strata serve`, `generate` and `bench`, and by the tests that drive the engine in-process.
#include <memory>
#include <optional>
#include <string>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "daemon/engine.h"
#include "daemon/rank_world.h"
#include "daemon/step_dispatcher.h"
#include "daemon/server_config.h"
#include "daemon/step_executor.h"
#include "kernels/backend.h"
#include "model/chat_template.h"
#include "model/gguf_file.h"
#include "model/llama_model.h"
#include "model/model_weights.h"
#include "model/tokenizer.h"
#include "parallel/device_comm.h"

namespace strata {

struct Runtime {
  std::shared_ptr<GgufFile> gguf;            // when the model is a GGUF file
  ModelWeights weights;
  std::optional<Tokenizer> tokenizer;        // absent for preset (dummy) models
  std::optional<ChatTemplate> chat_template;
  std::string model_name;                    // served id
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceComm> tp_device, pp_device;  // CUDA backend in a world: NCCL over the TP group, pipeline
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<PolicyCollectives> collectives;  // several ranks: over the TP group and the pipeline
  std::unique_ptr<StepExchange> exchange;          // several ranks: plans out, reports back
  std::unique_ptr<StepExecutor> executor;
};

// Loads model.path: a .gguf file, a Hugging Face directory (config.json + *.safetensors + tokenizer.json), or
// "preset:<name>" (dummy weights at real shapes, no tokenizer). Throws with the file, key or offset at fault.
// world: this rank's place and communicators; null: a world of one (the whole model).
std::unique_ptr<Runtime> make_runtime(const ServerConfig& config, const RankWorld* world = nullptr);

// The leader's dispatcher over the runtime (every rank must be running, the others in run_worker): its
// constructor exchanges a first step with them.
std::unique_ptr<StepDispatcher> make_dispatcher(Runtime& rt, const RankWorld* world);

// For models without a tokenizer (dummy weights): token i is the text "t<i>", nothing is special.
Tokenizer stand_in_tokenizer(const ModelConfig& config);

// The engine's settings from the configuration.
EngineOptions engine_options(const ServerConfig& config);

}  // namespace strata
