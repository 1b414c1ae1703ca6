#pragma once
// The deployment configuration: one YAML file per deployment (configs/), with command-line overrides.
// Every error names the file and the key, e.g. "configs/smollm2-cpu.yaml: engine.max_running: expected an
// integer >= 1, got 'many'". Unknown keys are errors too: a typo must not silently fall back to a default.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ServerConfig {
  std::string file;  // where it was read from, for error messages

  struct Model {
    std::string path;                       // a .gguf file, a Hugging Face directory, or "preset:<name>"
    std::string name;                       // the id served on /v1/models (default: the file's stem)
    std::string chat_template = "auto";     // auto | chatml | llama3 | mistral
    std::string system_prompt = "default";  // "default": the model's own default; otherwise this text
    std::string weight_dtype = "auto";      // auto (the file's formats) | f32 | q8_0 | f16 | bf16 (model_weights.h)
  } model;

  struct Server {
    std::string host = "127.0.0.1";
    int port = 8000;
    int threads = 2;                        // HTTP I/O threads
    int64_t max_body_bytes = 4 << 20;
    int max_n = 16;                         // largest `n` a request may ask for
    int max_prompts = 64;                   // most prompts in one completions request (a batch)
    bool ignore_unknown_fields = false;     // request fields unknown to the OpenAI API: ignored, not refused
    int max_connections = 512;              // connections held at once; more get 503 (must fit the fd limit)
    bool access_log = true;                 // one stderr line per request: client, request line, status, time
    int idle_timeout_s = 15;                // a keep-alive connection idle this long is closed
    int drain_timeout_s = 30;               // SIGTERM: how long requests in flight may take to finish
    std::vector<std::string> api_keys;      // bearer keys for /v1/* (a YAML list, or comma-separated in --set)
    std::string api_key_file;               // one key per line; '#' lines and blank lines ignored
    bool metrics_require_key = false;       // whether /metrics needs a key too
  } server;

  struct Engine {
    int max_running = 16;
    int max_batch_tokens = 512;
    int max_waiting = 256;
    int threads = 0;                        // compute threads of the CPU backend; 0 = every core
    // auto | f32 | int8 | int16: what the CPU backend's quantized matmuls multiply the weights with
    // (kernels/backend.h); auto is int16 where the CPU kernels run at avx2 or above, f32 at baseline
    // (daemon/runtime.cpp)
    std::string activation_dtype = "auto";
    // auto | baseline | avx2 | avx512 | avx512_vnni | amx: the most the CPU kernels may use
    // (kernels/cpu/quantized_dot.h); auto is the best this machine has
    std::string cpu_kernels = "auto";
    std::string backend = "cpu";            // cpu | cuda (a build with -DSTRATA_CUDA=ON and a GPU)
    int device = -1;                        // CUDA device; -1: the node-local MPI rank modulo the GPUs present
    // on | off: a CUDA decode step's kernels launched overlapped, each starting while the one before it finishes
    // (kernels/cuda/overlapped_launch.cuh; Hopper and later, ignored before)
    bool cuda_overlap = true;
  } engine;

  struct KvCache {
    int block_size = 16;
    int64_t memory_mib = 1024;              // the pool's budget, per rank
    // f32 (unquantized: bf16 on CUDA) | f16 | bf16 (unquantized 16-bit) | int8 | int4 | int2 (KIVI, block_size 32)
    std::string dtype = "f32";
    // Whether sealed groups are quantized (KIVI), or every block holds its entries at full precision.
    bool quantized() const { return dtype.rfind("int", 0) == 0; }
    std::string policy = "full";            // a policy spec for every layer, e.g. "pyramidkv:budget=128"
    std::string layer_overrides;            // "0-1=full;28-29=snapkv:budget=256"
    std::string request_policies = "all";   // policies a request may choose ("all", "none", or a list)
    std::string pod_blocks;                 // PoD's layer blocks (strata calibrate); needed by policy pod
    bool prefix_caching = true;             // on | off: reuse the KV of prompt prefixes computed before
    // auto | end | chunked: chunked also compresses after every chunk; auto does so for the sequences whose
    // policies all have the chunked form, and runs the others as end
    std::string prefill_compression = "auto";
    int prefill_chunk = 512;                // chunked: prompt tokens between two compressions
  } kv_cache;

  struct Parallel {
    int tp = 1;
    int pp = 1;
    int timeout_s = 60;                     // how long a rank may stay silent before the world is ended
    int micro_batches = 0;                  // pieces a step is cut into along the pipeline; 0: pp (set: >= 1)
  } parallel;

  // strata route (router/router_options.h): the replicas it forwards to; its own listener is server.*, its
  // tokenizer model.*, and the replicas' block size kv_cache.block_size.
  struct Router {
    std::vector<std::string> replicas;      // http://host:port of each strata serve (a YAML list, or comma-separated)
    std::string policy = "cache_aware";     // cache_aware | round_robin
    int busy_threshold = 8;                 // outstanding requests at which a replica's prefix match stops counting
    int64_t index_blocks = 1 << 18;         // prompt blocks remembered (least recently used out)
    int health_interval_ms = 500;           // how often each replica's /health and /metrics are read
    int health_timeout_ms = 1000;           // a health check unanswered this long takes the replica out
    int connect_timeout_ms = 1000;
    int upstream_timeout_s = 600;           // the longest wait for any part of a replica's response
    bool forward_api_key = true;            // the client's Authorization header goes on to the replica
  } router;
};

ServerConfig load_server_config(const std::string& path);
// Applies "section.key=value" (the --set flag) with the same checks as the file.
void apply_config_override(ServerConfig& config, const std::string& assignment);
// Every API key: server.api_keys, then those of server.api_key_file (read now). Throws ConfigError naming the key
// when the file cannot be read, holds no key, or holds a key that cannot be used; never shows a key.
std::vector<std::string> configured_api_keys(const ServerConfig& config);
// The policies a request may choose, from kv_cache.request_policies ("all": every policy).
std::vector<std::string> request_policy_names(const ServerConfig& config);
// Every key the file may hold, for --help and error messages.
std::vector<std::string> config_keys();

}  // namespace strata
