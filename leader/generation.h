#pragma once
// The bridge between the HTTP front end (routing/) and the engine (daemon/): a validated request goes in,
// events come out on the request's sink. Tokenization happens before submit; detokenization, stop strings and
// logprobs are done by the engine, so that events carry final text.
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cache/policy_spec.h"
#include "grammar/grammar.h"
#include "leader/sampling_params.h"

namespace strata {

struct LogprobEntry {
  std::string token;            // the token's text (raw bytes, may be an incomplete UTF-8 piece)
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // top alternatives (text, logprob), most likely first
};

// A piece of one choice's output.
struct ChoiceDelta {
  int choice = 0;
  std::string text;                    // new text (complete UTF-8)
  std::vector<int32_t> token_ids;      // tokens generated in this step
  std::vector<LogprobEntry> logprobs;  // one per token when the request asked for logprobs
};

// A choice ended. finish_reason: "stop" (eos, a stop string, or the end of the grammar's document) or "length"
// (max_tokens or the context).
// Why a choice ended. The engine's own words (its metrics' labels, finish_reason_name); routing/ writes the
// OpenAI protocol's finish_reason from them.
enum class FinishReason : uint8_t {
  stop,    // EOS, a stop string or token, or the grammar's end
  length,  // max_tokens, or the context (or the pool) would be exceeded
  abort,   // the client went away (never reported to it)
};
constexpr std::string_view finish_reason_name(FinishReason reason) {
  return reason == FinishReason::stop ? "stop" : reason == FinishReason::length ? "length" : "abort";
}

struct ChoiceFinished {
  int choice = 0;
  FinishReason reason = FinishReason::stop;
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;  // of the prompt tokens, those whose KV came from the prefix cache
};

// All choices ended; nothing more will come.
struct RequestFinished {
  Usage usage;
};

// The request failed inside the engine; nothing more will come.
// Why the engine ended a request with an error. The front end decides what each means to its client (routing/
// maps them to HTTP statuses and error codes).
enum class Failure : uint8_t {
  step_failed,    // a step threw: the running requests fail, the server goes on
  rank_lost,      // a rank of the world failed: nothing more can run here
  shutting_down,  // the server stopped before the request ended (a drain's timeout, a stop)
  not_started,    // still queued when one of the above happened: nothing was generated, it may be retried elsewhere
};

struct RequestFailed {
  Failure why = Failure::step_failed;
  std::string message;
};

using GenerationEvent = std::variant<ChoiceDelta, ChoiceFinished, RequestFinished, RequestFailed>;

// Receives a request's events. on_event is called from the engine thread and must not block.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void on_event(GenerationEvent event) = 0;
  // True once the client has gone away: the engine then drops the request at its next step.
  virtual bool cancelled() const = 0;
};

struct GenerationRequest {
  std::string id;                       // "cmpl-..." / "chatcmpl-...", also in logs
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int n = 1;                            // independent choices for the same prompt
  std::optional<PolicySpec> kv_policy;  // the request's policy (kv_compression), validated; none: the server's
  // Structured output (routing/output_format.h): every choice is decoded under this grammar, and ends when its
  // document is complete and nothing can extend it. Null: free text.
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<GenerationSink> sink;
};

// What the HTTP layer needs from the daemon.
// Why the service turned a request away before queueing it. The front end decides what each means to its client
// (routing/ maps them to HTTP statuses and error codes).
enum class Refusal : uint8_t {
  queue_full,     // engine.max_waiting sequences are waiting: retry later
  draining,       // finishing what it has before it shuts down: retry on another server
  shutting_down,  // stopping now
  rank_lost,      // a rank of the world failed: this server cannot generate any more
};

struct SubmitRefused : std::runtime_error {
  SubmitRefused(Refusal why, const std::string& message) : std::runtime_error(message), why(why) {}
  Refusal why;
};

class GenerationService {
 public:
  virtual ~GenerationService() = default;
  // Queues the request. Throws std::invalid_argument for what only the engine can check (e.g. prompt plus
  // max_tokens beyond the context, a prompt the pool cannot hold), SubmitRefused when it takes no request now.
  virtual void submit(GenerationRequest request) = 0;
  virtual std::string metrics_text() = 0;          // Prometheus text format
  virtual std::string kv_state_json() = 0;         // per-layer KV state, for people who debug
  virtual bool healthy() const = 0;
};

}  // namespace strata
