// The same model through both load paths: the GGUF (Q/K rows permuted, interleaved RoPE) and a Hugging Face
// directory made from it by tools/gguf_to_hf.py (Q/K rows un-permuted, half-split RoPE). Their logits must agree
// at every position; at position 0 RoPE is the identity, so positions >= 1 are what shows the layouts are right.
// Two layers keep the conversion quick; they exercise the same code as thirty.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "model/gguf_file.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

std::vector<float> all_logits(const ModelWeights& weights, const std::vector<int32_t>& ids) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  LlamaModel model(*backend, weights);
  BlockPool pool(*backend, model.kv_layout(16), 64);
  KvCache cache(pool, 0, int(weights.layers.size()));
  const BatchSequence seq{1, ids, 0, LogitsMode::all};
  std::vector<float> logits;
  model.forward({&seq, 1}, cache, logits);
  return logits;
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab, int position) {
  float d = 0.0f;
  for (int64_t v = 0; v < vocab; ++v) d = std::max(d, std::fabs(a[position * vocab + v] - b[position * vocab + v]));
  return d;
}

TEST(HfCheckpoint, SafetensorsAndGgufGiveTheSameLogitsBeyondPositionZero) {
  test::TempDir dir;
  const std::string command = "cd '" + test::source_path("") + "' && .venv/bin/python tools/gguf_to_hf.py '" +
                              test::smollm2_gguf_path() + "' '" + dir.path().string() + "' --layers 2 > '" +
                              (dir.path() / "log.txt").string() + "' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed (is .venv set up? run tools/setup.sh)";

  ShardSpec two_layers;
  two_layers.layer_end = 2;
  const ModelWeights gguf = load_gguf_weights(GgufFile::open(test::smollm2_gguf_path()), two_layers);
  const ModelWeights hf = load_safetensors_weights(dir.path().string(), two_layers);
  ASSERT_EQ(gguf.config.rope_style, RopeStyle::interleaved);
  ASSERT_EQ(hf.config.rope_style, RopeStyle::half_split);

  const std::vector<int32_t> ids = {504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 6124, 314, 19356, 30};
  const int64_t vocab = gguf.config.vocab_size;
  const std::vector<float> a = all_logits(gguf, ids), b = all_logits(hf, ids);
  float worst = 0.0f;
  for (int t = 0; t < int(ids.size()); ++t) worst = std::max(worst, max_difference(a, b, vocab, t));
  EXPECT_LT(worst, 1e-4f) << "largest logit difference between the two load paths";

  // The check has teeth: the HF weights with the GGUF's RoPE style agree at position 0 only.
  ModelWeights wrong = load_safetensors_weights(dir.path().string(), two_layers);
  wrong.config.rope_style = RopeStyle::interleaved;
  const std::vector<float> c = all_logits(wrong, ids);
  EXPECT_LT(max_difference(a, c, vocab, 0), 1e-4f);
  EXPECT_GT(max_difference(a, c, vocab, int(ids.size()) - 1), 1e-2f);
}

}  // namespace
}  // namespace strata
