// libFuzzer harness: the report every rank sends the leader after a step (parallel/rank_report.h), of arbitrary
// bytes.
// Expected: std::runtime_error for a malformed report. Bugs: a crash, a sanitizer report, a report accepted whose
// per-sequence lists do not have one entry per layer, that does not encode back to as many bytes, or whose
// re-encoding does not decode to the same report.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "parallel/rank_report.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void check_layer_lists(const strata::RankReport& report) {
  for (const strata::SequenceKv& s : report.sequences) {
    if (s.entries.size() != report.layers.size() || s.blocks.size() != report.layers.size()) {
      strata::fuzz::fail("sequence " + std::to_string(s.seq) + " accepted with per-layer lists of another length");
    }
  }
  for (const strata::SequenceDetail& d : report.details) {
    if (d.layers.size() != report.layers.size()) {
      strata::fuzz::fail("the detail of sequence " + std::to_string(d.seq) + " accepted with another layer count");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  strata::RankReport report;
  try {
    report = strata::deserialize_rank_report(bytes);
  } catch (const std::runtime_error&) {
    return 0;
  }
  check_layer_lists(report);
  const std::vector<uint8_t> encoded = strata::serialize(report);
  if (encoded.size() != bytes.size()) strata::fuzz::fail("an accepted report encodes to a different length");
  if (strata::serialize(strata::deserialize_rank_report(encoded)) != encoded) {
    strata::fuzz::fail("a re-encoded report decodes differently");
  }
  return 0;
}
