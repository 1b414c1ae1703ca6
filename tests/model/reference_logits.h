#pragma once
// The committed reference logits of SmolLM2 (tests/fixtures/reference/README.md: Hugging Face transformers on the
// same GGUF, fp32): prompt ids, 64 greedy ids with their top-2 margins, and for every prompt position the 16 best
// ids and their logits, descending.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/source_path.h"

namespace strata::test {

constexpr int kReferenceTopK = 16;

struct ReferenceLogits {
  std::string name;
  std::vector<int32_t> prompt_ids, greedy_ids;
  std::vector<float> greedy_margins;
  std::vector<int32_t> top_ids;    // [T, 16]
  std::vector<float> top_logits;   // [T, 16]
};

// "short_text", "chat_capital", "code_digits", "long_text".
inline ReferenceLogits load_reference_logits(const std::string& name) {
  ReferenceLogits r;
  r.name = name;
  const std::string base = source_path("tests/fixtures/reference/" + name);
  std::ifstream js(base + ".json");
  if (!js) throw std::runtime_error("missing fixture " + base + ".json");
  const nlohmann::json j = nlohmann::json::parse(js);
  r.prompt_ids = j.at("prompt_ids").get<std::vector<int32_t>>();
  r.greedy_ids = j.at("greedy_ids").get<std::vector<int32_t>>();
  r.greedy_margins = j.at("greedy_margins").get<std::vector<float>>();
  std::ifstream bin(base + ".topk.bin", std::ios::binary);
  const size_t n = r.prompt_ids.size();
  std::vector<char> raw(n * kReferenceTopK * 8);
  bin.read(raw.data(), std::streamsize(raw.size()));
  if (size_t(bin.gcount()) != raw.size()) throw std::runtime_error("short fixture " + base + ".topk.bin");
  r.top_ids.resize(n * kReferenceTopK);
  r.top_logits.resize(n * kReferenceTopK);
  for (size_t t = 0; t < n; ++t) {
    std::memcpy(&r.top_ids[t * kReferenceTopK], raw.data() + t * kReferenceTopK * 8, kReferenceTopK * 4);
    std::memcpy(&r.top_logits[t * kReferenceTopK], raw.data() + t * kReferenceTopK * 8 + kReferenceTopK * 4,
                kReferenceTopK * 4);
  }
  return r;
}

// The first index of the largest value.
inline int32_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return int32_t(best);
}

// Two models' logits over the same reference prompts, compared position by position: where their top-1 tokens agree,
// where the first one's agrees with the reference's, and how far apart their logits are.
struct TopOneAgreement {
  int positions = 0, same = 0, same_as_reference = 0;
  double largest_difference = 0;

  // a and b: [prompt positions, vocab] logits of `ref`'s prompt.
  void add(const std::vector<float>& a, const std::vector<float>& b, const ReferenceLogits& ref, int64_t vocab) {
    for (size_t t = 0; t < ref.prompt_ids.size(); ++t) {
      const int64_t top = argmax(a.data() + int64_t(t) * vocab, vocab);
      same += top == argmax(b.data() + int64_t(t) * vocab, vocab);
      same_as_reference += top == ref.top_ids[t * kReferenceTopK];
    }
    for (size_t k = 0; k < a.size(); ++k) {
      largest_difference = std::max(largest_difference, double(std::fabs(a[k] - b[k])));
    }
    positions += int(ref.prompt_ids.size());
  }
};

}  // namespace strata::test
