#pragma once
// strata_request_errors_total{status}: the requests the front end answered with an error status. The front end
// owns it because statuses are its business (the engine reports reasons: leader/generation.h); /metrics appends it
// to the engine's exposition. A status has no series until its first error.
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

namespace strata {

class RequestErrorCounter {
 public:
  RequestErrorCounter();
  void record(int http_status);  // thread-safe
  std::string text() const;      // Prometheus text format

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& errors_;
};

}  // namespace strata
