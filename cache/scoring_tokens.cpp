#include "cache/scoring_tokens.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace strata {
namespace {

constexpr int kReconstructionLead = 8;  // the chunk's first tokens, named in the instruction

}  // namespace

int reconstruction_rows(const ReconstructionPrompt& prompt, int prefill_chunk) {
  return int(prompt.instruction.size()) + std::min(kReconstructionLead, prefill_chunk) +
         int(prompt.answer_start.size()) + prefill_chunk;
}

std::vector<int32_t> scoring_tokens(const ScoringRows& rows, const CompressionConfig& config,
                                    std::span<const int32_t> prefill, int point) {
  std::vector<int32_t> tokens;
  if (rows.source == ScoringSource::prompt_tail) {
    const std::span<const int32_t> tail = prefill.last(size_t(rows.count));
    tokens.assign(tail.begin(), tail.end());
  } else if (rows.source == ScoringSource::chunk_reconstruction) {
    const int chunk = config.prefill_chunk;
    if (chunk <= 0 || point < chunk || point % chunk != 0 || size_t(point) > prefill.size()) {
      throw std::logic_error("scoring_tokens: " + std::to_string(point) + " is not a compression point");
    }
    const std::span<const int32_t> text = prefill.subspan(size_t(point - chunk), size_t(chunk));
    const ReconstructionPrompt& prompt = config.reconstruction;
    tokens = prompt.instruction;
    tokens.insert(tokens.end(), text.begin(), text.begin() + std::min(kReconstructionLead, chunk));
    tokens.insert(tokens.end(), prompt.answer_start.begin(), prompt.answer_start.end());
    tokens.insert(tokens.end(), text.begin(), text.end());
  }
  if (int(tokens.size()) != rows.count) throw std::logic_error("scoring_tokens: not the rows' count");
  return tokens;
}

}  // namespace strata
