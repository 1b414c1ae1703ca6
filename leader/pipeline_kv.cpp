#include "leader/pipeline_kv.h"

#include <algorithm>
#include <stdexcept>

namespace strata {

PipelineKv::PipelineKv(std::vector<RankReport> stages) : stages_(std::move(stages)) {
  if (stages_.empty()) throw std::invalid_argument("pipeline kv: no stages");
  for (const RankReport& s : stages_) {
    if (s.block_size != stages_[0].block_size || s.block_size <= 0) {
      throw std::invalid_argument("pipeline kv: stages have KV blocks of " + std::to_string(stages_[0].block_size) +
                                  " and " + std::to_string(s.block_size) + " tokens");
    }
    auto& index = index_.emplace_back();
    for (size_t i = 0; i < s.sequences.size(); ++i) index.emplace(s.sequences[i].seq, i);
  }
}

const SequenceKv* PipelineKv::find(int stage, SeqId seq) const {
  const auto& index = index_.at(size_t(stage));
  auto it = index.find(seq);
  return it == index.end() ? nullptr : &stages_[size_t(stage)].sequences[it->second];
}

int64_t PipelineKv::blocks_to_append(int stage, SeqId seq, int n_new) const {
  const SequenceKv* s = find(stage, seq);
  const int64_t bs = block_size();
  int64_t total = 0;
  for (int l = 0; l < n_layers(stage); ++l) {
    const int64_t have = s ? s->blocks[size_t(l)] : 0;
    const int64_t entries = (s ? s->entries[size_t(l)] : 0) + int64_t(n_new);
    total += std::max<int64_t>(0, (entries + bs - 1) / bs - have);
  }
  return total;
}

int64_t PipelineKv::blocks_held(int stage, SeqId seq) const {
  const SequenceKv* s = find(stage, seq);
  return s == nullptr ? 0 : s->blocks_held;
}

int64_t PipelineKv::blocks_for_entries(int stage, std::span<const int> entries) const {
  const int64_t bs = block_size();
  const int begin = stages_.at(size_t(stage)).layer_begin;
  int64_t total = 0;
  for (int l = 0; l < n_layers(stage); ++l) total += (int64_t(entries[size_t(begin + l)]) + bs - 1) / bs;
  return total;
}

}  // namespace strata
