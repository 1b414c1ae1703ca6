#include "daemon/runtime.h"

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "cache/prefill_footprint.h"
#include "kernels/cpu/amx_probe.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/model_loader.h"
#include "model/reconstruction_prompt.h"
#include "parallel/comm_policy_collectives.h"
#ifdef STRATA_HAVE_NCCL
#include "parallel/nccl_comm.h"
#endif
#include "parallel/rank_grid.h"

namespace strata {
namespace {

constexpr std::string_view kPresetPrefix = "preset:";

std::string default_system_prompt(const ServerConfig::Model& m, std::string_view jinja) {
  if (m.system_prompt != "default") return m.system_prompt;
  // SmolLM2's template inserts its own system prompt when a chat has none.
  return jinja.find(kSmolLm2SystemPrompt) != std::string_view::npos ? std::string(kSmolLm2SystemPrompt) : "";
}

ChatTemplate choose_template(const ServerConfig::Model& m, std::string_view jinja) {
  const std::string system = default_system_prompt(m, jinja);
  if (m.chat_template == "auto") {
    ChatTemplate detected = ChatTemplate::detect(jinja);
    return ChatTemplate(detected.kind(), system);
  }
  return ChatTemplate::from_name(m.chat_template, system);
}

// engine.cpu_kernels: the level the CPU kernels run at, the machine's best unless the config names one below it.
cpu::CpuIsa cpu_kernels_level(const ServerConfig& config) {
  const std::string& name = config.engine.cpu_kernels;
  cpu::CpuIsa level = cpu::best_cpu_isa();
  if (name == "auto" || !cpu::cpu_isa_from_name(name, level)) return level;
  if (!cpu::cpu_supports(level)) {
    throw ConfigError(config.file + ": engine.cpu_kernels: " + name + " is beyond this machine (its best: " +
                      std::string(cpu::cpu_isa_name(cpu::best_cpu_isa())) + ")");
  }
  return level;
}

// engine.activation_dtype on the CPU backend; auto is int16 where the kernels' level has an integer tile kernel
// (AVX2 and up), which gives fp32's answers faster than fp32 there, and f32 at baseline, where int16 would run the
// fp32 kernels on the rounded values (docs/decisions.md, [cpu-xeon]).
ActivationDtype cpu_activation_dtype(const ServerConfig& config) {
  const std::string& a = config.engine.activation_dtype;
  if (a == "auto") {
    return cpu_kernels_level(config) != cpu::CpuIsa::baseline ? ActivationDtype::int16 : ActivationDtype::f32;
  }
  return a == "int8" ? ActivationDtype::int8 : a == "int16" ? ActivationDtype::int16 : ActivationDtype::f32;
}

// engine.backend: the CPU backend, or the CUDA one on engine.device (by default the node-local rank's GPU, so
// that mpirun's ranks on one node take one GPU each).
std::unique_ptr<Backend> make_backend(const ServerConfig& config) {
  cpu::limit_cpu_isa(cpu_kernels_level(config));
  if (config.engine.backend == "cpu") return make_cpu_backend(cpu_activation_dtype(config));
  if (config.engine.activation_dtype != "auto" && config.engine.activation_dtype != "f32") {
    throw ConfigError(config.file + ": engine.activation_dtype: " + config.engine.activation_dtype +
                      " is a CPU backend option; the CUDA backend multiplies in bf16");
  }
#ifdef STRATA_HAVE_CUDA
  const int n = cuda_device_count();
  if (n == 0) throw ConfigError(config.file + ": engine.backend: cuda: " + cuda_unavailable_reason());
  int device = config.engine.device;
  if (device < 0) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    device = local ? std::atoi(local) % n : 0;
  }
  if (device >= n) {
    throw ConfigError(config.file + ": engine.device: " + std::to_string(device) + ", but " + std::to_string(n) +
                      " CUDA device(s) are present");
  }
  return make_cuda_backend(device, config.engine.cuda_overlap);
#else
  throw ConfigError(config.file + ": engine.backend: cuda: this build has no CUDA backend (nvcc was not found when "
                    "CMake configured it)");
#endif
}

// The NCCL communicators of a CUDA rank over its TP group and its pipeline (parallel/nccl_comm.h), bootstrapped over
// their MPI twins: collective over the world, in this order on every rank. Null for a group of one.
std::pair<std::unique_ptr<DeviceComm>, std::unique_ptr<DeviceComm>> make_device_comms(const RankWorld& world,
                                                                                      Backend& backend) {
#ifdef STRATA_HAVE_NCCL
  const RankGrid& g = world.grid();
  std::vector<std::string> tp_names, pp_names;
  for (int t = 0; t < g.tp; ++t) tp_names.push_back(g.describe(g.rank_of(g.stage(), t)));
  for (int s = 0; s < g.pp; ++s) pp_names.push_back(g.describe(g.rank_of(s, g.tp_rank())));
  void* stream = cuda_stream(backend);
  std::pair<std::unique_ptr<DeviceComm>, std::unique_ptr<DeviceComm>> comms;
  if (world.tp()) {
    comms.first = std::make_unique<NcclComm>(*world.tp(), std::move(tp_names),
                                             "the TP group of pp_stage " + std::to_string(g.stage()), world.deadline(),
                                             stream);
  }
  if (world.pp()) {
    comms.second = std::make_unique<NcclComm>(*world.pp(), std::move(pp_names),
                                              "the pipeline of tp_rank " + std::to_string(g.tp_rank()),
                                              world.deadline(), stream);
  }
  return comms;
#else
  return {};  // engine.backend cuda is refused earlier in a build without CUDA (make_backend)
#endif
}

}  // namespace

std::string activations_name(const ServerConfig& config) {
  if (config.engine.backend != "cpu") return "bf16";
  const ActivationDtype a = cpu_activation_dtype(config);
  return a == ActivationDtype::int8 ? "int8" : a == ActivationDtype::int16 ? "int16" : "f32";
}

namespace {

// kv_cache.dtype f16 | bf16: the pool's full-precision blocks in that type, half an fp32 pool's memory (the CPU
// widens them as it reads them, kernels/cpu/kv_rows.h). CUDA's pool is bf16 whatever is asked: f16 is refused there.
KvBlockLayout half_pool_layout(const ServerConfig& config, KvBlockLayout layout) {
  const DType asked = config.kv_cache.dtype == "f16" ? DType::f16 : DType::bf16;
  if (config.engine.backend != "cpu" && asked != layout.dtype) {
    throw ConfigError(config.file + ": kv_cache.dtype: " + config.kv_cache.dtype + " is for the CPU backend; the " +
                      config.engine.backend + " backend's pool is " + dtype_name(layout.dtype));
  }
  layout.dtype = asked;
  return layout;
}

}  // namespace

KvBlockLayout kv_pool_layout(const ServerConfig& config, KvBlockLayout layout) {
  const std::string& dtype = config.kv_cache.dtype;
  if (dtype == "f32") return layout;
  if (!config.kv_cache.quantized()) return half_pool_layout(config, layout);
  layout.quant = dtype == "int8" ? KvQuant::int8 : dtype == "int4" ? KvQuant::int4 : KvQuant::int2;
  if (layout.block_size != kKvQuantGroup) {
    throw ConfigError(config.file + ": kv_cache.block_size: kv_cache.dtype " + dtype + " needs " +
                      std::to_string(kKvQuantGroup) + " (one quantization group per block), got " +
                      std::to_string(layout.block_size));
  }
  if (layout.head_dim % kKvQuantGroup != 0) {
    throw ConfigError(config.file + ": kv_cache.dtype: " + dtype + " groups values by " +
                      std::to_string(kKvQuantGroup) + " channels; the model's head dim is " +
                      std::to_string(layout.head_dim));
  }
  // A slot that packs one group saves nothing and still rounds every entry (int8 in CUDA's bf16 blocks).
  if (layout.quantized_per_slot() < 2) {
    throw ConfigError(config.file + ": kv_cache.dtype: " + dtype + " packs " +
                      std::to_string(layout.quantized_per_slot()) + " group into a " +
                      dtype_name(layout.dtype) + " block of this backend, so it would save no memory; use int4");
  }
  return layout;
}

// This rank's part of the model: its stage's layers and, under tensor parallelism, its slice of the heads, the MLP
// and the vocabulary. A start-up error names parallel.tp when the model's dimensions do not divide.
ShardSpec shard_of(const ServerConfig& config, const RankGrid& grid, const ModelConfig& mc) {
  const std::pair<const char*, int> dims[] = {{"query heads", mc.n_heads},
                                              {"KV heads", mc.n_kv_heads},
                                              {"MLP width (d_ff)", mc.d_ff},
                                              {"vocabulary size", mc.vocab_size}};
  for (const auto& [what, value] : dims) {
    if (value % grid.tp != 0) {
      throw ConfigError(config.file + ": parallel.tp: the model's " + std::to_string(value) + " " + what +
                        " do not divide among " + std::to_string(grid.tp) + " tensor ranks");
    }
  }
  ShardSpec shard;
  try {
    std::tie(shard.layer_begin, shard.layer_end) = stage_layers(mc.n_layers, grid.pp, grid.stage());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.file + ": " + e.what());
  }
  shard.tp_rank = grid.tp_rank();
  shard.tp_size = grid.tp;
  shard.has_embedding = grid.is_first_stage();
  shard.has_output = grid.is_last_stage();
  return shard;
}

namespace {

// Reads model.path into rt: this rank's shard of the weights and, where the model has them, its tokenizer and chat
// template, and the name it is served under.
void load_model(const ServerConfig& config, const RankGrid& grid, RankRuntime& rt) {
  namespace fs = std::filesystem;
  const ServerConfig::Model& m = config.model;
  auto shard = [&](const ModelConfig& mc) { return shard_of(config, grid, mc); };
  const WeightDtype weight_dtype = parse_weight_dtype(m.weight_dtype);  // checked when the config was read
  if (m.path.rfind(kPresetPrefix, 0) == 0) {
    const ModelConfig mc = preset_config(m.path.substr(kPresetPrefix.size()));
    rt.weights = make_dummy_weights(mc, shard(mc), /*seed=*/1234, weight_dtype);
    rt.model_name = m.name.empty() ? m.path.substr(kPresetPrefix.size()) : m.name;
  } else if (fs::is_directory(m.path)) {
    const ModelConfig mc = config_from_hf_json((fs::path(m.path) / "config.json").string());
    rt.weights = load_safetensors_weights(m.path, shard(mc), weight_dtype);
    const std::string tokenizer_json = (fs::path(m.path) / "tokenizer.json").string();
    if (fs::exists(tokenizer_json)) rt.tokenizer = Tokenizer::from_hf_json(tokenizer_json);
    rt.chat_template = choose_template(m, "");
    rt.model_name = m.name.empty() ? fs::path(m.path).filename().string() : m.name;
  } else {
    if (!fs::exists(m.path)) {
      throw ConfigError(config.file + ": model.path: " + m.path + " does not exist (tools/setup.sh fetches the default model)");
    }
    rt.gguf = GgufFile::open(m.path);
    rt.weights = load_gguf_weights(rt.gguf, shard(config_from_gguf(*rt.gguf)), weight_dtype);
    rt.tokenizer = Tokenizer::from_gguf(*rt.gguf);
    rt.chat_template = choose_template(m, rt.gguf->get_string("tokenizer.chat_template").value_or(""));
    rt.model_name = m.name.empty() ? fs::path(m.path).stem().string() : m.name;
  }
}

// The model over the loaded weights, with the device communicators of a distributed CUDA rank.
void make_model(const ServerConfig& config, const RankWorld* world, const RankGrid& grid, RankRuntime& rt) {
  ShardComms comms{world ? world->tp() : nullptr, world ? world->pp() : nullptr};
  if (world && world->distributed() && config.engine.backend == "cuda") {
    std::tie(rt.tp_device, rt.pp_device) = make_device_comms(*world, *rt.backend);
    comms.tp_device = rt.tp_device.get();
    comms.pp_device = rt.pp_device.get();
  }
  rt.model = std::make_unique<LlamaModel>(*rt.backend, rt.weights, comms);
  // The backend holds its own copies of what it repacked (or uploaded to the GPU): the mapping's pages need not stay
  // in this process's memory. What is still read from the file (F32 norms, k-quant blocks used in place)
  // comes back on first use.
  if (rt.gguf) rt.gguf->release_pages();
  // Pipeline micro-batches: by default one per stage, so that every stage has work once the pipeline is full.
  if (grid.pp > 1) {
    rt.model->set_micro_batches(config.parallel.micro_batches > 0 ? config.parallel.micro_batches : grid.pp);
  }
}

// The KV block pool of kv_cache.memory_mib and the cache of this rank's layers over it.
void make_kv_cache(const ServerConfig& config, RankRuntime& rt) {
  const ShardSpec& sh = rt.weights.shard;
  const KvBlockLayout layout = kv_pool_layout(config, rt.model->kv_layout(config.kv_cache.block_size));
  const int64_t n_blocks = BlockPool::blocks_for_memory(layout, config.kv_cache.memory_mib << 20);
  // A quantized pool keeps one block in reserve for sealing (cache/block_pool.h).
  if (n_blocks < sh.layer_end - sh.layer_begin + (layout.quant == KvQuant::none ? 0 : 1)) {
    throw ConfigError(config.file + ": kv_cache.memory_mib: " + std::to_string(config.kv_cache.memory_mib) +
                      " MiB does not hold one block per layer (" + std::to_string(layout.block_bytes()) +
                      " bytes each)");
  }
  rt.pool = std::make_unique<BlockPool>(*rt.backend, layout, n_blocks);
  rt.cache = std::make_unique<KvCache>(*rt.pool, sh.layer_begin, sh.layer_end);
}

// kv_cache.prefill_compression: with chunked, every layer's configured policy has a chunked form and the layers agree
// on their scoring rows; with end, none needs chunked prefill (KVzip); with auto, the layers do not mix one that
// needs chunks with one that has no chunked form.
void check_prefill_compression(const ServerConfig& config, const RankRuntime& rt) {
  const CompressionConfig compression = compression_config(config, rt);
  const ModelConfig& mc = rt.weights.config;
  const PolicyContext context{0, mc.n_layers, mc.n_heads, mc.n_kv_heads, rt.model_name};
  if (compression.chunked_where_possible) {
    try {
      compression.for_sequence(std::nullopt, context);  // throws for a mix it cannot decide
    } catch (const std::invalid_argument& e) {
      throw ConfigError(config.file + ": " + e.what());
    }
  }
  for (int l = 0; l < mc.n_layers && !compression.chunked_where_possible; ++l) {
    const PolicySpec& spec = compression.for_layer(l);
    const PolicyContext layer_context{l, mc.n_layers, mc.n_heads, mc.n_kv_heads, rt.model_name};
    const PolicyTraits traits = make_policy(spec, layer_context)->traits();
    if (!compression.chunked() && traits.needs_chunked_prefill) {
      throw ConfigError(config.file + ": kv_cache.prefill_compression: end, but policy " + spec.name + " (layer " +
                        std::to_string(l) + ") compresses prefill chunks only; use chunked or auto " +
                        "(docs/compression.md)");
    }
    if (compression.chunked() && !traits.compresses_prefill_chunks) {
      throw ConfigError(config.file + ": kv_cache.prefill_compression: chunked, but policy " + spec.name +
                        " (layer " + std::to_string(l) + ") has no chunked form; use end or auto, or one of full, " +
                        "streaming, h2o, snapkv, pyramidkv, expected_attention, kvzip (docs/compression.md)");
    }
  }
  try {
    prefill_scoring_rows(compression, std::nullopt, context, mc.max_context);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.file + ": kv_cache.layer_overrides: " + e.what());
  }
}

// The step executor with kv_cache's compression policy (and POD's layer blocks), and the collectives and step
// exchange of a distributed rank.
void make_executor(const ServerConfig& config, const RankWorld* world, RankRuntime& rt) {
  CompressionConfig compression = compression_config(config, rt);
  if (world && world->distributed()) {
    rt.collectives = std::make_unique<CommPolicyCollectives>(world->tp(), world->pp(), rt.weights.config.n_layers);
    rt.exchange = std::make_unique<StepExchange>(*world->world());
  }
  rt.executor = std::make_unique<StepExecutor>(*rt.model, *rt.cache, std::move(compression), rt.model_name,
                                               rt.collectives.get());
  if (!config.kv_cache.pod_blocks.empty()) {
    // Read and checked on every rank against the whole model and the configured stages (cache/pod_blocks.h).
    const std::string where = config.file + ": kv_cache.pod_blocks: ";
    try {
      PodBlocks blocks = read_pod_blocks(config.kv_cache.pod_blocks);
      check_pod_blocks(blocks, config.kv_cache.pod_blocks, rt.model_name, rt.weights.config.n_layers,
                       rt.weights.config.n_kv_heads, config.parallel.pp);
      rt.executor->set_pod_blocks(std::move(blocks));
    } catch (const std::runtime_error& e) {
      throw ConfigError(where + e.what());
    }
  }
  check_prefill_compression(config, rt);
  if (config.kv_cache.policy.rfind("pod", 0) == 0 && config.kv_cache.pod_blocks.empty()) {
    throw ConfigError(config.file + ": kv_cache.pod_blocks: policy pod needs the layer blocks of strata calibrate");
  }
  if (config.kv_cache.policy.rfind("pod", 0) == 0 && config.kv_cache.quantized()) {
    throw ConfigError(config.file + ": kv_cache.dtype: policy pod needs an unquantized pool (its key-free blocks are "
                      "not quantized)");
  }
}

// One line on stderr: what this rank serves, and with what weights, KV pool and backend.
void log_runtime(const ServerConfig& config, const RankGrid& grid, const RankRuntime& rt) {
  const ShardSpec& sh = rt.weights.shard;
  const KvBlockLayout& layout = rt.pool->layout();
  const int64_t n_blocks = BlockPool::blocks_for_memory(layout, config.kv_cache.memory_mib << 20);  // reserve included
  std::cerr << "strata: " << (grid.world_size() > 1 ? grid.describe(grid.rank) + ": " : "") << rt.model_name
            << ": layers [" << sh.layer_begin << ", " << sh.layer_end << ") of " << rt.weights.config.n_layers
            << (sh.tp_size > 1 ? ", tensor slice " + std::to_string(sh.tp_rank + 1) + "/" + std::to_string(sh.tp_size)
                               : std::string())
            << ", weights " << (held_weight_bytes(rt.weights, *rt.backend, true) + (1 << 19)) / (1 << 20) << " MiB"
            << ", KV pool of " << n_blocks << " blocks x " << layout.block_size << " tokens ("
            << (config.kv_cache.memory_mib) << " MiB: room for "
            << (n_blocks * layout.block_size / (sh.layer_end - sh.layer_begin))
            << " tokens in all layers at " << dtype_name(layout.dtype) << "), KV dtype "
            << config.kv_cache.dtype;
  // How many sealed groups a block's memory packs: what quantization really saves (int8 on a bf16 pool: one).
  if (layout.quant != KvQuant::none) std::cerr << " (" << layout.quantized_per_slot() << " sealed groups a block)";
  std::cerr << ", backend " << rt.backend->name() << " (CPU kernels " << cpu::cpu_isa_name(cpu::best_cpu_isa());
  std::cerr << ", " << activations_name(config) << " activations, AMX "
            << cpu::amx_state_name(cpu::amx_probe().state) << ")\n";
}

}  // namespace

int64_t held_weight_bytes(const ModelWeights& w, const Backend& backend, bool embedding) {
  int64_t n = 0;
  for (const LayerWeights& L : w.layers) {
    for (const WeightMatrix* m :
         {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down}) {
      n += backend.uploaded_weight_bytes(*m);
    }
  }
  if (w.shard.has_output) n += backend.uploaded_weight_bytes(w.output_norm) + backend.uploaded_weight_bytes(w.output);
  const bool tied = w.shard.has_output && w.output.data == w.token_embd.data;
  if (embedding && w.token_embd.data != nullptr && !tied) n += backend.uploaded_weight_bytes(w.token_embd);
  return n;
}

ModelFrontEnd load_model_front_end(const ServerConfig& config) {
  namespace fs = std::filesystem;
  const ServerConfig::Model& m = config.model;
  const std::string where = config.file + ": model.path: ";
  if (m.path.rfind(kPresetPrefix, 0) == 0) throw ConfigError(where + "a preset model has no tokenizer to route by");
  if (fs::is_directory(m.path)) {
    const std::string tokenizer_json = (fs::path(m.path) / "tokenizer.json").string();
    if (!fs::exists(tokenizer_json)) throw ConfigError(where + tokenizer_json + " does not exist");
    return {Tokenizer::from_hf_json(tokenizer_json), choose_template(m, ""),
            m.name.empty() ? fs::path(m.path).filename().string() : m.name,
            config_from_hf_json((fs::path(m.path) / "config.json").string()).max_context};
  }
  if (!fs::exists(m.path)) throw ConfigError(where + m.path + " does not exist");
  const auto gguf = GgufFile::open(m.path);
  return {Tokenizer::from_gguf(*gguf), choose_template(m, gguf->get_string("tokenizer.chat_template").value_or("")),
          m.name.empty() ? fs::path(m.path).stem().string() : m.name, config_from_gguf(*gguf).max_context};
}

std::unique_ptr<RankRuntime> make_runtime(const ServerConfig& config, const RankWorld* world) {
  auto rt = std::make_unique<RankRuntime>();
  if (config.model.path.empty()) {
    throw ConfigError(config.file + ": model.path: missing (a .gguf file, a directory or preset:NAME)");
  }
  const RankGrid grid = world ? world->grid() : RankGrid{};
  // engine.threads: the CPU backend's compute threads (0: every core this process may run on).
  cpu::set_compute_threads(config.engine.threads);
  // Before the weights are read: a backend that cannot run (no GPU, a policy it lacks) fails in a second, not
  // after minutes of loading.
  rt->backend = make_backend(config);
  load_model(config, grid, *rt);
  make_model(config, world, grid, *rt);
  make_kv_cache(config, *rt);
  make_executor(config, world, *rt);
  log_runtime(config, grid, *rt);
  return rt;
}

std::unique_ptr<StepDispatcher> make_dispatcher(RankRuntime& rt, const RankWorld* world) {
  const RankGrid grid = world ? world->grid() : RankGrid{};
  return std::make_unique<StepDispatcher>(grid, *rt.executor, *rt.cache, rt.exchange.get());
}

Tokenizer stand_in_tokenizer(const ModelConfig& config) {
  TokenizerData data;
  for (int i = 0; i < config.vocab_size; ++i) data.tokens.push_back("t" + std::to_string(i));
  return Tokenizer(std::move(data));
}

CompressionConfig compression_config(const ServerConfig& config, const RankRuntime& rt) {
  CompressionConfig compression;
  if (rt.tokenizer && rt.chat_template) {
    compression.reconstruction = reconstruction_prompt(*rt.tokenizer, *rt.chat_template);
  }
  compression.policy = parse_policy_spec(config.kv_cache.policy);
  compression.overrides = parse_layer_overrides(config.kv_cache.layer_overrides);
  if (config.kv_cache.prefill_compression != "end") compression.prefill_chunk = config.kv_cache.prefill_chunk;
  compression.chunked_where_possible = config.kv_cache.prefill_compression == "auto";
  return compression;
}

EngineOptions engine_options(const ServerConfig& config, const RankRuntime& rt) {
  EngineOptions o;
  o.limits.max_running = config.engine.max_running;
  o.limits.max_batch_tokens = config.engine.max_batch_tokens;
  o.max_waiting = config.engine.max_waiting;
  o.compression = compression_config(config, rt);
  const ModelConfig& mc = rt.weights.config;
  o.policy_context = PolicyContext{0, mc.n_layers, mc.n_heads, mc.n_kv_heads, rt.model_name, nullptr};
  o.policy_context.collectives = &single_rank_collectives();
  o.policy_context.prefill_chunk = o.compression.prefill_chunk;
  if (config.kv_cache.prefix_caching) {
    PrefixCacheSettings prefix;
    // The KV of a token depends on the model, its weights' format and the pool's (a quantized pool's prefill reads
    // quantized entries of earlier chunks), besides the tokens before it.
    prefix.salt = std::hash<std::string>{}(config.model.path + "|" + config.model.weight_dtype + "|" +
                                           config.kv_cache.dtype + "|" + config.engine.backend);
    prefix.publish_generated = !config.kv_cache.quantized();
    o.prefix_cache = std::move(prefix);
  }
  return o;
}

}  // namespace strata
