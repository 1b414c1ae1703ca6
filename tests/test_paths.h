#pragma once
// Paths the C++ tests use. The model file is fetched by tools/setup.sh; a test that needs it and does not find
// it fails with a message naming that step (never a silent pass).
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace strata::test {

inline std::string source_path(const std::string& relative) {
  return std::string(STRATA_SOURCE_DIR) + "/" + relative;
}

inline std::string smollm2_gguf_path() {
  std::string path = source_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "model file " << path << " is missing: run tools/setup.sh to fetch it";
  }
  return path;
}

}  // namespace strata::test
