#include "leader/prefix_cache.h"

#include <algorithm>

#include "leader/block_hash_chain.h"

namespace strata {

PrefixCache::PrefixCache(int block_size, PrefixCacheSettings settings, CompressionConfig compression,
                         PolicyContext context)
    : block_size_(block_size),
      settings_(std::move(settings)),
      compression_(std::move(compression)),
      policy_context_(context),
      index_(block_size, settings_.salt) {}

int PrefixCache::pin(SeqId seq, std::span<const int32_t> tokens, int prefill_len,
                     const std::optional<PolicySpec>& policy) {
  SequenceUse& use = uses_[seq];
  if (use.prefill_len != prefill_len) {
    use.chain = index_.chain(tokens.first(size_t(prefill_len)));
    use.reuse = prefix_reuse(compression_, policy, policy_context_, prefill_len);
    use.prefill_len = prefill_len;
    plan_compressed(use, policy);
  }
  const int point = use.reuse.compressed_point;
  if (use.started_compressed) return point;
  if (!use.compressed.empty() && use.n_started == 0 &&
      index_.has_compressed(use.compressed, tokens.first(size_t(point)), use.policy)) {
    index_.acquire(use.compressed);
    use.used.insert(use.used.end(), use.compressed.begin(), use.compressed.end());
    use.started_compressed = true;
    return point;
  }
  const int allowed = use.reuse.max_cached_tokens / block_size_;
  const int hit = std::min(index_.cached_blocks(use.chain, tokens), allowed);
  // Blocks published since the last call extend the pin; those pinned stay (the index keeps what is in use).
  if (hit > use.n_started) {
    const std::span<const uint64_t> more = std::span(use.chain).subspan(size_t(use.n_started), size_t(hit - use.n_started));
    index_.acquire(more);
    use.used.insert(use.used.end(), more.begin(), more.end());
    use.n_started = hit;
    use.next_block = hit;
  }
  return use.n_started * block_size_;
}

void PrefixCache::plan_compressed(SequenceUse& use, const std::optional<PolicySpec>& policy) {
  use.compressed.clear();
  const int point = use.reuse.compressed_point, entries = use.reuse.compressed_entries;
  if (point == 0 || point % block_size_ != 0 || entries == 0 || entries % block_size_ != 0) {
    return;
  }
  use.policy.clear();
  for (int l = 0; l < policy_context_.n_layers_total; ++l) {
    use.policy += to_string(policy ? *policy : compression_.for_layer(l)) + ";";
    if (policy) break;  // a request's policy is every layer's
  }
  // The chain of the prefill's tokens names their prefix up to the point by its block there.
  use.compressed = compressed_block_chain(use.chain[size_t(point / block_size_ - 1)], use.policy,
                                          entries / block_size_);
}

bool PrefixCache::copies(SeqId seq) const {
  auto it = uses_.find(seq);
  return it != uses_.end() && it->second.reuse.copies && !it->second.started_compressed;
}

void PrefixCache::start(StepPlan& plan, SeqId seq, int prefill_len) {
  auto it = uses_.find(seq);
  if (it == uses_.end() || (it->second.n_started == 0 && !it->second.started_compressed)) return;
  SequenceUse& use = it->second;
  if (use.started_compressed) {
    plan.prefix_started.push_back(
        PrefixStart{seq, use.compressed, int32_t(prefill_len), false, int32_t(use.reuse.compressed_point)});
    return;
  }
  plan.prefix_started.push_back(PrefixStart{seq, {use.chain.begin(), use.chain.begin() + use.n_started},
                                            int32_t(prefill_len), use.reuse.copies});
  // Its copies are its own: the originals may go once this plan, which copies them, is planned (plan_done).
  if (use.reuse.copies) {
    copied_.insert(copied_.end(), use.used.begin(), use.used.end());
    use.used.clear();
  }
}

void PrefixCache::publish(StepPlan& plan, SeqId seq, std::span<const int32_t> tokens, int chunk_end,
                          int prefill_len) {
  auto it = uses_.find(seq);
  if (it == uses_.end()) return;
  SequenceUse& use = it->second;
  if (!use.reuse.may_publish) return;
  publish_compressed(plan, seq, use, tokens, chunk_end);
  // Generated tokens' blocks hold what a prefill of them would write only where no policy rewrites entries.
  const bool generated = settings_.publish_generated && !use.reuse.copies;
  const int written = generated ? chunk_end : std::min(chunk_end, prefill_len);
  const int complete = std::min(written, use.reuse.max_published_tokens) / block_size_;
  if (complete > int(use.chain.size())) index_.extend_chain(use.chain, tokens.first(size_t(complete) * size_t(block_size_)));
  // A block that another sequence published first is not this sequence's: its later blocks were computed over
  // its own copy, so they are not published either (a cached chain is always one computation).
  for (int i = use.next_block; use.publishing && i < complete; ++i) {
    if (!index_.publish(use.chain, i, tokens)) {
      use.publishing = false;
      break;
    }
    plan.prefix_published.push_back(PrefixPublish{seq, int32_t(i), use.chain[size_t(i)]});
    use.used.push_back(use.chain[size_t(i)]);
    use.next_block = i + 1;
  }
}

// The prefill reaches its last compression point, which it computed itself: what its layers hold right after
// the step's hooks is published (the ranks publish compressed blocks after the hooks).
void PrefixCache::publish_compressed(StepPlan& plan, SeqId seq, SequenceUse& use, std::span<const int32_t> tokens,
                                     int chunk_end) {
  const int point = use.reuse.compressed_point;
  if (use.compressed.empty() || use.started_compressed || chunk_end != point) return;
  if (!index_.publish_compressed(use.compressed, tokens.first(size_t(point)), use.policy)) return;
  for (size_t i = 0; i < use.compressed.size(); ++i) {
    plan.prefix_published.push_back(PrefixPublish{seq, int32_t(i), use.compressed[i], true});
  }
  use.used.insert(use.used.end(), use.compressed.begin(), use.compressed.end());
}

void PrefixCache::plan_done() {
  index_.release(copied_);
  copied_.clear();
}

void PrefixCache::release(SeqId seq) {
  auto it = uses_.find(seq);
  if (it == uses_.end()) return;
  index_.release(it->second.used);
  uses_.erase(it);
}

PrefixCache::SequenceBlocks PrefixCache::blocks_of(SeqId seq) const {
  auto it = uses_.find(seq);
  if (it == uses_.end()) return {};
  const SequenceUse& use = it->second;
  if (use.started_compressed) return {int(use.compressed.size()), 0, true};
  return {use.reuse.copies ? 0 : use.n_started, use.next_block - use.n_started};
}

void PrefixCache::evict(StepPlan& plan, int64_t n) {
  const std::vector<uint64_t> gone = index_.evict(n);
  plan.prefix_evicted.insert(plan.prefix_evicted.end(), gone.begin(), gone.end());
}

}  // namespace strata
