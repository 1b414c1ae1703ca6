#include "routing/prompt_batch.h"

#include <mutex>
#include <utility>
#include <variant>

namespace strata {
namespace {

// What the prompts of one batch share. The engine thread calls the sinks; the lock keeps the count and the first
// failure right whichever thread that is.
struct BatchState {
  BatchState(std::shared_ptr<GenerationSink> response, int prompts)
      : response(std::move(response)), unfinished(prompts) {}
  std::shared_ptr<GenerationSink> response;
  std::mutex mutex;
  int unfinished;
  Usage usage;         // summed over the finished prompts
  bool failed = false;
};

class PromptSink final : public GenerationSink {
 public:
  PromptSink(std::shared_ptr<BatchState> batch, int first_choice)
      : batch_(std::move(batch)), first_choice_(first_choice) {}

  void on_event(GenerationEvent event) override {
    std::lock_guard lock(batch_->mutex);
    if (batch_->failed) return;
    if (auto* delta = std::get_if<ChoiceDelta>(&event)) {
      delta->choice += first_choice_;
    } else if (auto* finished = std::get_if<ChoiceFinished>(&event)) {
      finished->choice += first_choice_;
    } else if (auto* request_finished = std::get_if<RequestFinished>(&event)) {
      Usage& sum = batch_->usage;
      sum.prompt_tokens += request_finished->usage.prompt_tokens;
      sum.completion_tokens += request_finished->usage.completion_tokens;
      sum.cached_prompt_tokens += request_finished->usage.cached_prompt_tokens;
      if (--batch_->unfinished > 0) return;
      event = RequestFinished{sum};
    } else {
      batch_->failed = true;
    }
    batch_->response->on_event(std::move(event));
  }

  bool cancelled() const override {
    if (batch_->response->cancelled()) return true;
    std::lock_guard lock(batch_->mutex);
    return batch_->failed;
  }

 private:
  std::shared_ptr<BatchState> batch_;
  int first_choice_;
};

}  // namespace

std::vector<std::shared_ptr<GenerationSink>> prompt_batch_sinks(std::shared_ptr<GenerationSink> response, int prompts,
                                                                int n_per_prompt) {
  if (prompts == 1) return {std::move(response)};
  auto batch = std::make_shared<BatchState>(std::move(response), prompts);
  std::vector<std::shared_ptr<GenerationSink>> sinks;
  for (int i = 0; i < prompts; ++i) sinks.push_back(std::make_shared<PromptSink>(batch, i * n_per_prompt));
  return sinks;
}

}  // namespace strata
