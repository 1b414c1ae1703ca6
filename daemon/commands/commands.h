#pragma once
// The subcommands of the `strata` binary. Each takes the arguments after its name and returns the exit code.
namespace strata {

int serve_command(int argc, char** argv);      // strata serve --config FILE [--port N] ...
int generate_command(int argc, char** argv);   // strata generate --config FILE --prompt TEXT ...
int bench_command(int argc, char** argv);      // strata bench ...
int tokenize_command(int argc, char** argv);   // strata tokenize --model FILE [--special] : JSON lines in and out
int eval_command(int argc, char** argv);       // strata eval --config FILE ... (defined in eval/)
int calibrate_command(int argc, char** argv);  // strata calibrate --config FILE --text FILE --out BLOCKS

}  // namespace strata
