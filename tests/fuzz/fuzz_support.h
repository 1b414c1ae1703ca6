#pragma once
// What several libFuzzer harnesses share (docs/fuzzing.md): the fuzzer's bytes as a file, for parsers that open a
// path, and SmolLM2's tokenizer and chat template, for harnesses that encode text as the server does.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/chat_template.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"

namespace strata::fuzz {

// Stops the run with a message: libFuzzer counts the abort as a crash and keeps the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what.c_str());
  std::abort();
}

// The bytes in an anonymous memory file; path() names it for open() (/proc/self/fd/N), as a model file would be.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(memfd_create("fuzz-input", MFD_CLOEXEC)) {
    if (fd_ < 0) fail("memfd_create");
    for (size_t written = 0; written < size;) {
      const ssize_t n = ::write(fd_, data + written, size - written);
      if (n <= 0) fail("writing the memory file");
      written += size_t(n);
    }
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// SmolLM2's tokenizer, loaded once from the model that tools/setup.sh fetches.
inline const Tokenizer& smollm2_tokenizer() {
  static const Tokenizer tokenizer = [] {
    const std::string path = std::string(STRATA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    try {
      return Tokenizer::from_gguf(*GgufFile::open(path));
    } catch (const std::exception& e) {
      fail(std::string("cannot load the tokenizer (tools/setup.sh fetches the model): ") + e.what());
    }
  }();
  return tokenizer;
}

// The template the server uses for SmolLM2: ChatML with the model's default system prompt.
inline const ChatTemplate& smollm2_chat_template() {
  static const ChatTemplate chat_template(ChatTemplateKind::chatml, std::string(kSmolLm2SystemPrompt));
  return chat_template;
}

}  // namespace strata::fuzz
