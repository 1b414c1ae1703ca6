#pragma once
// A GenerationSink for tests that drive the engine in-process: it records every event of one request.
#include <map>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "leader/generation.h"

namespace strata::test {

// Collects one request's events.
class RecordingSink final : public GenerationSink {
 public:
  void on_event(GenerationEvent event) override {
    std::lock_guard lock(mutex_);
    if (auto* d = std::get_if<ChoiceDelta>(&event)) {
      text[d->choice] += d->text;
      auto& ids = tokens[d->choice];
      ids.insert(ids.end(), d->token_ids.begin(), d->token_ids.end());
      auto& entries = logprobs[d->choice];
      entries.insert(entries.end(), d->logprobs.begin(), d->logprobs.end());
      n_deltas++;
    } else if (auto* f = std::get_if<ChoiceFinished>(&event)) {
      finish_reason[f->choice] = finish_reason_name(f->reason);
    } else if (auto* r = std::get_if<RequestFinished>(&event)) {
      usage = r->usage;
      finished = true;
    } else if (auto* e = std::get_if<RequestFailed>(&event)) {
      error = e->message;
    }
  }
  bool cancelled() const override { return cancel_after_deltas >= 0 && n_deltas >= cancel_after_deltas; }

  std::mutex mutex_;
  std::map<int, std::string> text, finish_reason;
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::vector<LogprobEntry>> logprobs;  // when the request asked for them
  Usage usage;
  bool finished = false;
  std::string error;
  int n_deltas = 0;
  int cancel_after_deltas = -1;
};

}  // namespace strata::test
