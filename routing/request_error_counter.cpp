#include "routing/request_error_counter.h"

#include <prometheus/text_serializer.h>

namespace strata {

RequestErrorCounter::RequestErrorCounter()
    : registry_(std::make_shared<prometheus::Registry>()),
      errors_(prometheus::BuildCounter()
                  .Name("strata_request_errors_total")
                  .Help("Requests failed, by HTTP status.")
                  .Register(*registry_)) {}

void RequestErrorCounter::record(int http_status) { errors_.Add({{"status", std::to_string(http_status)}}).Increment(); }

std::string RequestErrorCounter::text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace strata
