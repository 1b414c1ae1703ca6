#pragma once
// strata eval's shared prefill: each prompt is prefilled once, by a `full` sequence that sums every prompt row's
// attention in every layer (StepExecutor::share_prefill), and every job on that prompt starts from a copy of its
// cache instead of prefilling again. Nothing is evicted before a prompt ends (cache/compression_policy.h), so the
// cache at the prompt's end does not depend on the policy; what does is the attention a policy sums:
//   - a policy that sums every prompt row (H2O, D2O) or none (StreamingLLM, full) forks at the prompt's end with
//     the shared sums: its prompt-end hooks run at once;
//   - one that sums a window at the prompt's end (SnapKV, PyramidKV, SimLayerKV, SpindleKV) forks at the last
//     prefill chunk boundary before its window and computes the rest of the prompt itself, with its own sums;
//   - one that changes the prefill itself (PoD shares keys across layers) prefills on its own.
// The chunks are the ones a job prefilling alone computes (multiples of the prefill chunk from position 0), so a
// forked job scores exactly what it scores alone (tests/eval/eval_test.cpp checks it bit for bit).
#include <optional>

#include "cache/compression_policy.h"
#include "cache/policy_spec.h"

namespace strata {

struct JobStart {
  enum Kind { own_prefill, fork_prefix, fork_prefilled } kind = own_prefill;
  int entries = 0;  // fork_prefix: the entries copied (a multiple of the prefill chunk)
};

// How a job with this policy (in every layer; context: any layer's) starts from a shared prompt of prompt_len
// tokens prefilled in chunks of prefill_chunk.
JobStart job_start(const PolicySpec& policy, PolicyContext context, int prompt_len, int prefill_chunk);

}  // namespace strata
