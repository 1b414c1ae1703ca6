// libFuzzer harness: a .safetensors file of arbitrary bytes (model/safetensors_file.h).
// Expected: SafetensorsError for a malformed file. Bugs: a crash, a sanitizer report, a tensor whose data is not
// inside the data section or overlaps another, a size that disagrees with its shape and dtype.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/safetensors_file.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void check_tensors(const strata::SafetensorsFile& file, uint64_t file_size) {
  uint64_t previous_end = file.data_offset();
  for (const strata::SafetensorsTensor& t : file.tensors()) {
    if (t.offset < file.data_offset() || t.offset > file_size || t.n_bytes > file_size - t.offset) {
      strata::fuzz::fail("tensor '" + t.name + "' lies outside the data section");
    }
    if (t.n_bytes > 0 && t.offset < previous_end) strata::fuzz::fail("tensor '" + t.name + "' overlaps another");
    if (t.n_bytes > 0) previous_end = t.offset + t.n_bytes;
    if (uint64_t(t.n_elements()) * uint64_t(t.element_bytes) != t.n_bytes) {
      strata::fuzz::fail("tensor '" + t.name + "': shape and dtype disagree with its size");
    }
    if (file.find(t.name) != &t) strata::fuzz::fail("tensor '" + t.name + "' is not found by its name");
    t.ggml_type();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const strata::fuzz::MemoryFile input(data, size);
  std::shared_ptr<strata::SafetensorsFile> file;
  try {
    file = strata::SafetensorsFile::open(input.path());
  } catch (const strata::SafetensorsError&) {
    return 0;
  }
  check_tensors(*file, size);
  return 0;
}
