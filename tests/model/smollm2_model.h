#pragma once
// The real SmolLM2-135M model on the CPU backend, loaded once per test process and shared by the suites that run
// it (the reference logits and the reference selections), with a KV pool of 3,000 blocks of 16 tokens.
#include <memory>

#include "cache/block_pool.h"
#include "kernels/backend.h"
#include "model/gguf_file.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "tests/test_paths.h"

namespace strata::test {

struct SmolLm2 {
  std::shared_ptr<GgufFile> gguf;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<BlockPool> pool;  // declared last: released first
};

inline SmolLm2& smollm2() {
  static SmolLm2 m = [] {
    SmolLm2 s;
    s.gguf = GgufFile::open(smollm2_gguf_path());
    s.weights = std::make_unique<ModelWeights>(load_gguf_weights(s.gguf, ShardSpec{}));
    s.backend = make_cpu_backend();
    s.model = std::make_unique<LlamaModel>(*s.backend, *s.weights);
    s.pool = std::make_unique<BlockPool>(*s.backend, s.model->kv_layout(16), 3000);
    return s;
  }();
  return m;
}

}  // namespace strata::test
