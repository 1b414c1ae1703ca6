// command_text: the command line that benchmarks and `strata eval` record must run again when pasted into a shell.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "daemon/commands/machine_info.h"

namespace strata {
namespace {

std::string text_of(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return command_text("eval", int(argv.size()), argv.data());
}

// What /bin/sh makes of `printf '<%s>' ARGS`, one <...> per argument.
std::string shell_split(const std::string& args) {
  const std::string command = "printf '<%s>' " + args;
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buf[256];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  pclose(pipe);
  return out;
}

TEST(CommandText, PlainArgumentsStayAsTyped) {
  EXPECT_EQ(text_of({"--budgets", "64,20%", "--set", "kv_cache.pod_blocks=configs/x.txt"}),
            "strata eval --budgets 64,20% --set kv_cache.pod_blocks=configs/x.txt");
}

TEST(CommandText, EmptyAndSpecialArgumentsSurviveAShell) {
  const std::vector<std::string> args = {"--quantized", "", "--policies", "a b", "it's", "$HOME", "x;y", "\\"};
  const std::string text = text_of(args);
  std::string expected;
  for (const std::string& a : args) expected += "<" + a + ">";
  EXPECT_EQ(shell_split(text.substr(std::string("strata eval ").size())), expected) << text;
}

}  // namespace
}  // namespace strata
