// strata tokenize: the tokenizer as a filter, one JSON value per line, for tests against the reference
// (tests/model/tokenizer_reference_test.py) and for looking at how a prompt is split.
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"

namespace strata {

namespace {

constexpr const char* kUsage =
    "usage: strata tokenize --model FILE.gguf [--special] [--decode [--skip-special]]\n"
    "  Reads JSON lines from stdin and writes one JSON line per input line to stdout.\n"
    "  encode (default): each line a JSON string -> a JSON array of token ids\n"
    "  --special         parse special-token strings such as <|im_end|> (off: they are ordinary text)\n"
    "  --decode          each line a JSON array of ids -> a JSON string (invalid UTF-8 as U+FFFD)\n"
    "  --skip-special    with --decode, leave special tokens out of the text\n";

std::string process_line(const Tokenizer& tokenizer, const std::string& line, bool decode, bool special,
                         bool skip_special) {
  const nlohmann::json input = nlohmann::json::parse(line);
  if (decode) {
    if (!input.is_array()) throw std::invalid_argument("expected a JSON array of token ids");
    const auto ids = input.get<std::vector<int32_t>>();
    return nlohmann::json(tokenizer.decode(ids, skip_special)).dump();
  }
  if (!input.is_string()) throw std::invalid_argument("expected a JSON string");
  return nlohmann::json(tokenizer.encode(input.get_ref<const std::string&>(), special)).dump();
}

}  // namespace

int tokenize_command(int argc, char** argv) {
  bool decode = false, special = false, skip_special = false;
  std::string model_path;
  try {
    const CommandLine cl(argc, argv, {"model"}, {"special", "decode", "skip-special", "help"});
    if (cl.has("help") || !cl.has("model")) {
      (cl.has("help") ? std::cout : std::cerr) << kUsage;
      return cl.has("help") ? 0 : 2;
    }
    model_path = cl.get("model");
    decode = cl.has("decode");
    special = cl.has("special");
    skip_special = cl.has("skip-special");
  } catch (const std::invalid_argument& e) {
    std::cerr << "strata tokenize: " << e.what() << "\n" << kUsage;
    return 2;
  }

  size_t line_number = 0;
  try {
    const auto gguf = GgufFile::open(model_path);
    const Tokenizer tokenizer = Tokenizer::from_gguf(*gguf);
    std::ios::sync_with_stdio(false);
    std::string line;
    while (std::getline(std::cin, line)) {
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::cout << process_line(tokenizer, line, decode, special, skip_special) << '\n' << std::flush;
    }
  } catch (const std::exception& e) {
    std::cerr << "strata tokenize: ";
    if (line_number > 0) std::cerr << "stdin line " << line_number << ": ";
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace strata
