// routing/prompt_batch.h: a batch's prompts report to one sink as one request.
#include "routing/prompt_batch.h"

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

class RecordingSink final : public GenerationSink {
 public:
  void on_event(GenerationEvent event) override { events.push_back(std::move(event)); }
  bool cancelled() const override { return client_left; }
  std::vector<GenerationEvent> events;
  bool client_left = false;
};

TEST(PromptBatch, OnePromptReportsStraightToTheResponse) {
  auto response = std::make_shared<RecordingSink>();
  auto sinks = prompt_batch_sinks(response, 1, 3);
  ASSERT_EQ(sinks.size(), 1u);
  EXPECT_EQ(sinks[0], response);
}

TEST(PromptBatch, ChoicesAreNumberedByPromptThenChoiceAndTheUsageIsSummedAtTheLastFinish) {
  auto response = std::make_shared<RecordingSink>();
  auto sinks = prompt_batch_sinks(response, 3, 2);
  ASSERT_EQ(sinks.size(), 3u);
  sinks[2]->on_event(ChoiceDelta{1, "c", {7}, {}});
  sinks[0]->on_event(ChoiceFinished{0, FinishReason::stop});
  sinks[1]->on_event(ChoiceDelta{0, "b", {8}, {}});
  sinks[2]->on_event(RequestFinished{Usage{5, 2, 1}});
  sinks[0]->on_event(RequestFinished{Usage{3, 1, 0}});
  ASSERT_EQ(response->events.size(), 3u);  // the finishes of unfinished batches are held back
  EXPECT_EQ(std::get<ChoiceDelta>(response->events[0]).choice, 5);
  EXPECT_EQ(std::get<ChoiceDelta>(response->events[0]).text, "c");
  EXPECT_EQ(std::get<ChoiceFinished>(response->events[1]).choice, 0);
  EXPECT_EQ(std::get<ChoiceDelta>(response->events[2]).choice, 2);
  sinks[1]->on_event(RequestFinished{Usage{4, 7, 16}});
  ASSERT_EQ(response->events.size(), 4u);
  const Usage usage = std::get<RequestFinished>(response->events[3]).usage;
  EXPECT_EQ(usage.prompt_tokens, 12);
  EXPECT_EQ(usage.completion_tokens, 10);
  EXPECT_EQ(usage.cached_prompt_tokens, 17);
}

TEST(PromptBatch, TheFirstFailureEndsTheBatchAndCancelsTheOtherPrompts) {
  auto response = std::make_shared<RecordingSink>();
  auto sinks = prompt_batch_sinks(response, 2, 1);
  EXPECT_FALSE(sinks[0]->cancelled());
  sinks[0]->on_event(RequestFinished{Usage{3, 1, 0}});
  sinks[1]->on_event(RequestFailed{Failure::step_failed, "too long"});
  EXPECT_TRUE(sinks[0]->cancelled());
  EXPECT_TRUE(sinks[1]->cancelled());
  sinks[1]->on_event(RequestFailed{Failure::step_failed, "again"});
  sinks[0]->on_event(ChoiceDelta{0, "late", {1}, {}});
  ASSERT_EQ(response->events.size(), 1u);
  EXPECT_EQ(std::get<RequestFailed>(response->events[0]).message, "too long");
}

TEST(PromptBatch, PromptsAreCancelledWhenTheClientLeaves) {
  auto response = std::make_shared<RecordingSink>();
  auto sinks = prompt_batch_sinks(response, 2, 1);
  response->client_left = true;
  EXPECT_TRUE(sinks[0]->cancelled());
  EXPECT_TRUE(sinks[1]->cancelled());
}

}  // namespace
}  // namespace strata
