#pragma once
// Paths the C++ tests use. The model file is fetched by tools/setup.sh; a test that needs it and does not find
// it fails with a message naming that step (never a silent pass).
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/source_path.h"

namespace strata::test {

inline std::string smollm2_gguf_path() {
  std::string path = source_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "model file " << path << " is missing: run tools/setup.sh to fetch it";
  }
  return path;
}

// A fresh directory under the system's temporary directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("strata_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace strata::test
