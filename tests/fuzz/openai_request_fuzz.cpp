// libFuzzer harness: a request body of either OpenAI dialect (routing/openai_protocol.h) parsed, validated and
// encoded with SmolLM2's tokenizer and template, then answered (whole and streamed) with the events an engine would
// send. The first byte picks the dialect and whether unknown fields are ignored.
// Expected: ApiError with 400 or 404, as the server answers bad requests. Bugs: any other exception (the server
// would answer 500), a crash, a sanitizer report, a request accepted beyond its limits, a response that is not JSON.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/compression_policy.h"
#include "routing/api_error.h"
#include "routing/openai_protocol.h"
#include "routing/prompt_batch.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/generation_events.h"

namespace {

using strata::fuzz::fail;

strata::ProtocolLimits smollm2_limits(bool ignore_unknown_fields) {
  strata::ProtocolLimits limits;
  limits.model_name = "SmolLM2-135M-Instruct";
  limits.max_context = 2048;
  limits.vocab_size = strata::fuzz::smollm2_tokenizer().vocab_size();
  limits.kv_policies = strata::policy_names();
  limits.ignore_unknown_fields = ignore_unknown_fields;
  return limits;
}

void check_accepted(const strata::ParsedCompletion& parsed, const strata::ProtocolLimits& limits) {
  const strata::GenerationRequest& request = parsed.request;
  if (request.n < 1 || request.n > limits.max_n) fail("n = " + std::to_string(request.n) + " accepted");
  if (request.prompt_ids.empty()) fail("an empty prompt accepted");
  for (int32_t id : request.prompt_ids) {
    if (id < 0 || id >= limits.vocab_size) fail("prompt token " + std::to_string(id) + " accepted");
  }
  if (request.sampling.max_tokens < 1 ||
      int64_t(request.prompt_ids.size()) + request.sampling.max_tokens > limits.max_context) {
    fail("a prompt of " + std::to_string(request.prompt_ids.size()) + " tokens with max_tokens " +
         std::to_string(request.sampling.max_tokens) + " accepted for a context of " +
         std::to_string(limits.max_context));
  }
}

// Records what a batch's prompt sinks pass on.
class RecordingSink final : public strata::GenerationSink {
 public:
  void on_event(strata::GenerationEvent event) override { events.push_back(std::move(event)); }
  bool cancelled() const override { return false; }
  std::vector<strata::GenerationEvent> events;
};

// The response bodies: one JSON document, or server-sent events of JSON documents ending in [DONE]; a batch's
// prompts report through their sinks (routing/prompt_batch.h), one after the other.
void check_responses(const std::vector<strata::ParsedCompletion>& batch) {
  const strata::ResponseContext context =
      strata::make_response_context(batch, strata::fuzz::smollm2_chat_template(), 1700000000);
  auto recorder = std::make_shared<RecordingSink>();
  const auto sinks = strata::prompt_batch_sinks(recorder, int(batch.size()), context.n_per_prompt);
  for (size_t i = 0; i < batch.size(); ++i) {
    for (strata::GenerationEvent& event : strata::fuzz::generation_events(batch[i].request)) {
      sinks[i]->on_event(std::move(event));
    }
  }
  strata::CompletionCollector collector(context);
  strata::StreamEncoder encoder(context);
  std::string events = encoder.begin();
  for (const strata::GenerationEvent& event : recorder->events) {
    collector.add(event);
    events += encoder.encode(event);
  }
  if (!collector.done() || !encoder.done()) fail("the response did not end after the request's last event");
  if (!nlohmann::json::accept(collector.body())) fail("the response body is not JSON");
  for (size_t start = 0; start < events.size();) {
    const size_t end = events.find("\n\n", start);
    if (end == std::string::npos || events.compare(start, 6, "data: ") != 0) fail("a malformed server-sent event");
    const std::string_view data = std::string_view(events).substr(start + 6, end - start - 6);
    if (data != "[DONE]" && !nlohmann::json::accept(data)) fail("a server-sent event is not JSON");
    start = end + 2;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  strata::fuzz::smollm2_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto dialect = (data[0] & 1) != 0 ? strata::ApiDialect::chat : strata::ApiDialect::completions;
  static const strata::ProtocolLimits strict = smollm2_limits(false), lenient = smollm2_limits(true);
  const strata::ProtocolLimits& limits = (data[0] & 2) != 0 ? lenient : strict;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<strata::ParsedCompletion> batch;
  try {
    batch = strata::parse_completion_request(body, dialect, limits);
    for (strata::ParsedCompletion& prompt : batch) {
      strata::encode_prompt(prompt, strata::fuzz::smollm2_tokenizer(), strata::fuzz::smollm2_chat_template(), limits);
    }
  } catch (const strata::ApiError& e) {
    if (e.http_status() != 400 && e.http_status() != 404) fail("status " + std::to_string(e.http_status()));
    return 0;
  }
  if (batch.empty() || int(batch.size()) > limits.max_prompts) fail(std::to_string(batch.size()) + " prompts accepted");
  if (int64_t(batch.size()) * batch.front().request.n > limits.max_sequences) {
    fail("more sequences than the engine queues accepted");
  }
  for (const strata::ParsedCompletion& prompt : batch) check_accepted(prompt, limits);
  check_responses(batch);
  return 0;
}
