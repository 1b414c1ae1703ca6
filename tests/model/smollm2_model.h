#pragma once
// The real SmolLM2-135M model on the CPU backend, loaded once per test process and weight dtype and shared by the
// suites that run it (the reference logits and the reference selections), with a KV pool of 6,400 blocks of 16
// tokens (KVzip's reference holds a 1,000-token prompt and its 1,027 scoring rows beside another 1,000-token
// prompt). The suites that compare with fp32 references use WeightDtype::f32; the quantized weights (the default
// everywhere else) have their own checks (tests/model/llama_quantized_reference_test.cpp).
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
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

inline SmolLm2 load_smollm2(WeightDtype dtype, ActivationDtype activations = ActivationDtype::f32) {
  SmolLm2 s;
  s.gguf = GgufFile::open(smollm2_gguf_path());
  s.weights = std::make_unique<ModelWeights>(load_gguf_weights(s.gguf, ShardSpec{}, dtype));
  s.backend = make_cpu_backend(activations);
  s.model = std::make_unique<LlamaModel>(*s.backend, *s.weights);
  s.pool = std::make_unique<BlockPool>(*s.backend, s.model->kv_layout(16), 6400);
  return s;
}

inline SmolLm2& smollm2(WeightDtype dtype = WeightDtype::f32) {
  static std::map<WeightDtype, SmolLm2> loaded;  // one model per weight dtype, loaded when first asked for
  auto it = loaded.find(dtype);
  if (it == loaded.end()) it = loaded.emplace(dtype, load_smollm2(dtype)).first;
  return it->second;
}

// The file's weights (WeightDtype::automatic) with engine.activation_dtype int8 or int16.
inline SmolLm2& smollm2_integer_activations(ActivationDtype activations) {
  if (activations == ActivationDtype::int16) {
    static SmolLm2 m = load_smollm2(WeightDtype::automatic, ActivationDtype::int16);
    return m;
  }
  static SmolLm2 m = load_smollm2(WeightDtype::automatic, ActivationDtype::int8);
  return m;
}

// Logits at every prompt position, the prompt fed `step` tokens at a time, its KV in `pool`.
inline std::vector<float> prompt_logits(LlamaModel& model, BlockPool& pool, const std::vector<int32_t>& ids,
                                        int step) {
  KvCache cache(pool, 0, model.config().n_layers);
  std::vector<float> all, chunk;
  for (size_t start = 0; start < ids.size(); start += size_t(step)) {
    const size_t len = std::min(size_t(step), ids.size() - start);
    const BatchSequence seq{1, std::span<const int32_t>(ids).subspan(start, len), int(start), LogitsMode::all};
    model.forward({&seq, 1}, cache, chunk);
    all.insert(all.end(), chunk.begin(), chunk.end());
  }
  return all;
}

inline std::vector<float> prompt_logits(SmolLm2& m, const std::vector<int32_t>& ids, int step) {
  return prompt_logits(*m.model, *m.pool, ids, step);
}

}  // namespace strata::test
