// libFuzzer harness: a GGUF file of arbitrary bytes (model/gguf_file.h), then what a loader reads of it: every
// metadata value through the typed getters, the tensor infos, and the tokenizer built from the metadata.
// Expected: GgufError for a malformed file or a value of the wrong type; std::runtime_error from the tokenizer
// (its documented error). Bugs: a crash, a sanitizer report, a tensor whose data is not inside the file.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "model/gguf_file.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using strata::GgufError;
using strata::GgufFile;

void check_tensors(const GgufFile& file, uint64_t file_size) {
  for (const strata::GgufTensorInfo& t : file.tensors()) {
    if (t.offset > file_size || t.n_bytes > file_size - t.offset) {
      strata::fuzz::fail("tensor '" + t.name + "' lies outside the file");
    }
    if (file.find_tensor(t.name) != &t) strata::fuzz::fail("tensor '" + t.name + "' is not found by its name");
    if (t.n_elements() < 0) strata::fuzz::fail("tensor '" + t.name + "' has a negative element count");
  }
}

// Every getter on every key: the right type returns a value, a wrong one throws GgufError.
void read_metadata(const GgufFile& file) {
  for (const auto& entry : file.metadata()) {
    const std::string& key = entry.first;
    const auto get = [&](auto getter) {
      try {
        (file.*getter)(key);
      } catch (const GgufError&) {
      }
    };
    get(&GgufFile::get_int);
    get(&GgufFile::get_float);
    get(&GgufFile::get_bool);
    get(&GgufFile::get_string);
    get(&GgufFile::get_string_array);
    get(&GgufFile::get_int_array);
    get(&GgufFile::get_float_array);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const strata::fuzz::MemoryFile input(data, size);
  std::shared_ptr<GgufFile> file;
  try {
    file = GgufFile::open(input.path());
  } catch (const GgufError&) {
    return 0;
  }
  check_tensors(*file, size);
  read_metadata(*file);
  try {
    strata::Tokenizer::from_gguf(*file);
  } catch (const std::runtime_error&) {  // GgufError is one too
  }
  return 0;
}
