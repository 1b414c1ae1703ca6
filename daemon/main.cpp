// strata: the serving daemon's one binary. Subcommands: serve, route, generate, bench, tokenize, eval, calibrate.
#include <cstring>
#include <iostream>
#include <string>

#include "daemon/build_commit.h"
#include "daemon/commands/commands.h"
#include "kernels/cpu/amx_probe.h"
#include "kernels/cpu/quantized_dot.h"

namespace {

void print_usage() {
  std::cout << "usage: strata <command> [flags]   (strata --version: the commit of the build)\n"
               "  serve     --config FILE [--port N] [--host H] [--set section.key=value]...\n"
               "            serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /metrics)\n"
               "  route     --config FILE --replica http://HOST:PORT... [--policy cache_aware|round_robin] [--port N]\n"
               "            forward the same API to replicas, each request where its prompt's prefix is cached\n"
               "  generate  --config FILE --prompt TEXT [--chat] [--max-tokens N] [--temperature T] [--seed S]\n"
               "            complete one prompt and print the text\n"
               "  bench     --config FILE [--model PATH|preset:NAME] [--batch 1,8] [--prompt-tokens N] [--gen-tokens N]\n"
               "            [--out FILE]  prefill and decode throughput\n"
               "  tokenize  --model FILE.gguf [--special] [--decode]\n"
               "            JSON lines in, JSON lines out\n"
               "  eval      --config FILE [--policies a,b] [--budgets 64,20%] [--out FILE]\n"
               "            quality (perplexity, passkey, agreement) and memory of each compression policy\n"
               "  calibrate --config FILE --text FILE --out BLOCKS [--threshold D | --target-saving S] [--pp P]\n"
               "            PoD's layer blocks from the similarity of attention between layers\n"
               "Run 'strata <command> --help' for the flags of one command.\n";
}

}  // namespace

int main(int argc, char** argv) {
  // The AMX probe catches SIGILL and SIGSEGV for the moment its tile product runs: here, before any thread starts.
  strata::cpu::amx_probe();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version")) {
    std::cout << "strata " << strata::build_commit() << "\n"
              << "cpu kernels: " << strata::cpu::cpu_isa_name(strata::cpu::best_cpu_isa()) << "\n"
              << "amx: " << strata::cpu::amx_summary() << "\n";
    return 0;
  }
  const std::string command = argv[1];
  int sub_argc = argc - 2;
  char** sub_argv = argv + 2;
  if (command == "serve") return strata::serve_command(sub_argc, sub_argv);
  if (command == "route") return strata::route_command(sub_argc, sub_argv);
  if (command == "generate") return strata::generate_command(sub_argc, sub_argv);
  if (command == "bench") return strata::bench_command(sub_argc, sub_argv);
  if (command == "tokenize") return strata::tokenize_command(sub_argc, sub_argv);
  if (command == "eval") return strata::eval_command(sub_argc, sub_argv);
  if (command == "calibrate") return strata::calibrate_command(sub_argc, sub_argv);
  std::cerr << "strata: unknown command '" << command << "'\n";
  print_usage();
  return 2;
}
