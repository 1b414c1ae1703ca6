#pragma once
// Decides what runs in the next engine step (continuous batching with chunked prefill):
//   1. every running sequence that has decoded so far takes its one decode token; when the pool cannot hold
//      them all, the most recently admitted sequences are preempted (their blocks are freed and they are
//      recomputed later, as vLLM does);
//   2. running sequences in the middle of their prompt take the next chunk;
//   3. waiting sequences are admitted in arrival order while the running count, the step's token budget and the
//      free blocks allow (the sequence's peak must fit: the whole remaining prompt, or with chunked prefill
//      compression its budget plus a chunk in every layer; plus a watermark kept for decodes).
// Pure over plain data: it reads the KV counts of every pipeline stage (a chunk must fit in each) and changes
// nothing itself.
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "leader/pipeline_kv.h"

namespace strata {

struct SchedulerLimits {
  int max_running = 16;        // sequences in the running batch
  int max_batch_tokens = 512;  // tokens processed per step (decodes + prefill chunks)
  double watermark = 0.01;     // fraction of the pool kept free at admission, so decodes rarely preempt
  // kv_cache.prefill_compression chunked (kv_cache.prefill_chunk): a prompt chunk never crosses a multiple of
  // this, where the ranks compress (CompressionConfig::compression_point). 0: chunks end anywhere.
  int prefill_chunk = 0;
};

// A sequence as the scheduler sees it.
struct SchedulerSequence {
  SeqId id = 0;
  int n_tokens = 0;  // known tokens: prompt plus generated
  int n_cached = 0;  // tokens already in the KV cache
  int n_copied = 0;  // a waiting sequence: of n_cached, tokens whose cached blocks it copies when admitted
  // A waiting sequence: the most entries each global layer holds while it is prefilled (cache/prefill_footprint.h),
  // copied blocks included. Empty: the whole remaining prompt.
  std::span<const int> peak_entries = {};
  // Chunked prefill: the scoring rows that a chunk ending at a compression point before the prefill's end carries
  // (PlannedWork::n_scoring): entries and tokens of the step besides the chunk's.
  int n_scoring = 0;
};

struct ScheduledChunk {
  SeqId id = 0;
  int start = 0;  // first token index (= its position)
  int n = 0;
  int n_scoring = 0;  // the scoring rows it carries (SchedulerSequence::n_scoring), or 0
};

struct Schedule {
  std::vector<ScheduledChunk> chunks;
  std::vector<SeqId> admitted;     // moved from waiting to running
  std::vector<SeqId> preempted;    // moved from running back to the front of waiting, blocks freed
  std::vector<SeqId> unservable;   // cannot grow even alone in the pool: the engine ends them ("length")
};

// running: in admission order (oldest first); waiting: in arrival order; releasing: finished sequences whose
// blocks the same step gives back before it runs (they count as free); kv: the blocks of every stage.
Schedule schedule_step(const std::vector<SchedulerSequence>& running, const std::deque<SchedulerSequence>& waiting,
                       std::span<const SeqId> releasing, const PipelineKv& kv, const SchedulerLimits& limits);

}  // namespace strata
