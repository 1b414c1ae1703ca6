// libFuzzer harness: the step messages other ranks receive (parallel/step_plan.h): a StepPlan or a StepResult of
// arbitrary bytes.
// Expected: std::runtime_error for a malformed message. Bugs: a crash, a sanitizer report, a message accepted that
// does not encode back to as many bytes, or whose re-encoding does not decode to the same message.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "parallel/step_plan.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

// decode(bytes) encodes back to bytes of the same length (flags become 0 or 1), and that encoding is a fixed point.
template <typename Message>
void check_round_trip(const std::vector<uint8_t>& bytes, Message (*decode)(const std::vector<uint8_t>&)) {
  Message message;
  try {
    message = decode(bytes);
  } catch (const std::runtime_error&) {
    return;
  }
  const std::vector<uint8_t> encoded = strata::serialize(message);
  if (encoded.size() != bytes.size()) strata::fuzz::fail("an accepted message encodes to a different length");
  if (strata::serialize(decode(encoded)) != encoded) strata::fuzz::fail("a re-encoded message decodes differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  check_round_trip(bytes, &strata::deserialize_step_plan);
  check_round_trip(bytes, &strata::deserialize_step_result);
  return 0;
}
