#pragma once
// Everything one rank holds to run its shard: the weights of its stage's layers and its tensor slice, the
// tokenizer and chat template, the backend, the KV pool and cache of its layers, the step executor, and, in a
// world of several ranks, the policies' collectives and the step exchange. daemon/runtime.h assembles it from the
// configuration; strata eval and the tests drive its executor directly.
#include <memory>
#include <optional>
#include <string>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "model/chat_template.h"
#include "model/gguf_file.h"
#include "model/llama_model.h"
#include "model/model_weights.h"
#include "model/tokenizer.h"
#include "parallel/device_comm.h"
#include "parallel/step_exchange.h"
#include "rank/step_executor.h"

namespace strata {

struct RankRuntime {
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

}  // namespace strata
