#pragma once
// The document the prefix-cache engine tests ask their questions about: the first 1,200 characters of a committed
// test text (about 270 SmolLM2 tokens).
#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_paths.h"

namespace strata::test {

inline std::string clock_document() {
  std::ifstream in(source_path("tests/fixtures/texts/how_clocks_keep_time.txt"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str().substr(0, 1200);
}

}  // namespace strata::test
