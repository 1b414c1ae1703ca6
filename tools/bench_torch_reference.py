#!/usr/bin/env python3
"""The PyTorch reference point of `strata bench` on a GPU (docs/gpu.md): the same shapes through Hugging Face
transformers' LlamaForCausalLM with dummy bf16 weights.

Decode: for each context N and batch B, a preallocated (static) KV cache of N + G entries per sequence whose first N
entries are filled with random keys and values (the same synthetic context as `strata bench --context`), then G
greedy decode steps at positions N..N+G-1, each timed after a CUDA synchronisation:
    decode tokens/s = B * G / (time of the G steps)
Prefill: one sequence of P random tokens, one forward pass: prefill tokens/s = P / time.
Cells whose cache does not fit in the GPU's free memory (or that run out of memory) are skipped with the reason.
Eager mode (transformers' default path) unless --compile MODE: then the forward pass is torch.compile'd
(fullgraph, static shapes: one compilation per batch and cache length) with that mode, "reduce-overhead" replaying
CUDA graphs (transformers' documented static-cache recipe); each decode cell runs --warmup-steps untimed steps first
(compilation, graph recording) and prefill stays eager.

  python3 tools/bench_torch_reference.py --model llama-3-8b --out torch-8b.json
  python3 tools/bench_torch_reference.py --model llama-3-70b --layers 33 --batch 1,8 --context 1024,4096
  python3 tools/bench_torch_reference.py --compile reduce-overhead --batch 1,64 --context 1024 --prefill-tokens ''
  python3 tools/bench_torch_reference.py --device cpu --tiny          # a smoke test without a GPU
"""
import argparse
import json
import platform
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

# The shapes of model/model_loader.cpp's presets (Llama-3.1: llama3 RoPE scaling).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
SHAPES = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256),
    "llama-3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, vocab_size=128256),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}


def numbers(text):
    return [int(x) for x in text.split(",") if x]


def make_config(name, layers):
    shape = dict(SHAPES[name])
    if layers:
        if not 1 <= layers <= shape["num_hidden_layers"]:
            sys.exit(f"--layers must be from 1 to {shape['num_hidden_layers']} for {name}")
        shape["num_hidden_layers"] = layers
    return LlamaConfig(**shape, max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="sdpa")


def make_model(config, device, seed):
    """Dummy bf16 weights without a slow initialisation: the modules are made on the meta device, given
    uninitialised memory on `device`, then filled there (matrices ~ N(0, 0.02^2), norms 1). The RoPE buffers are
    made again on the device, since to_empty leaves them uninitialised."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02, generator=generator)
            else:
                p.fill_(1.0)
    with torch.device(device):
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model.eval()


def cache_tensors(cache):
    """The (keys, values) tensors of every layer, [B, Hkv, max_len, Dh]: StaticCache keeps them per layer object in
    transformers 5 and in key_cache/value_cache lists before."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def kv_bytes(config, batch, length):
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * batch * config.num_key_value_heads * length * head_dim * 2


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_bytes(device):
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def decode_cell(model, compiled, config, device, batch, context, n_gen, n_warmup, generator):
    """G timed decode steps, after W untimed ones, after a synthetic context of `context` entries in a static cache
    of context + W + G. `compiled` is the model's compiled forward pass, or None for eager mode."""
    length = context + n_warmup + n_gen
    try:
        cache = StaticCache(config=config, max_batch_size=batch, max_cache_len=length, device=device,
                            dtype=torch.bfloat16)
    except TypeError:  # transformers 5: sized and placed lazily, by the first update
        cache = StaticCache(config=config, max_cache_len=length)
    tokens = torch.randint(100, config.vocab_size, (batch, 1), device=device, generator=generator)
    with torch.inference_mode():
        # One eager step at position 0 makes the cache allocate its tensors (lazily in transformers 5: not a side
        # effect to compile), then the first `context` entries of every layer get random keys and values.
        model(input_ids=tokens, past_key_values=cache, cache_position=torch.tensor([0], device=device),
              use_cache=True)
        for keys, values in cache_tensors(cache):
            keys[:, :, :context].normal_(generator=generator)
            values[:, :, :context].normal_(generator=generator)
        step_seconds = []
        step = model if compiled is None else compiled
        for i in range(n_warmup + n_gen):
            position = torch.tensor([context + i], device=device)
            sync(device)
            t0 = time.perf_counter()
            if compiled is not None:
                torch.compiler.cudagraph_mark_step_begin()
            logits = step(input_ids=tokens, past_key_values=cache, cache_position=position,
                          position_ids=position.expand(batch, 1), use_cache=True).logits
            tokens = logits[:, -1:].argmax(-1).clone()  # a graph's output is overwritten by its next replay
            sync(device)
            if i >= n_warmup:
                step_seconds.append(time.perf_counter() - t0)
    del cache
    seconds = sum(step_seconds)
    step_seconds.sort()
    return {"decode_seconds": seconds, "decode_steps": n_gen, "decode_tokens_per_second": batch * n_gen / seconds,
            "step_seconds": {"min": step_seconds[0], "median": step_seconds[len(step_seconds) // 2],
                             "max": step_seconds[-1]}}


def prefill_cell(model, config, device, n_tokens, generator):
    ids = torch.randint(100, config.vocab_size, (1, n_tokens), device=device, generator=generator)
    with torch.inference_mode():
        model(input_ids=ids[:, :16], use_cache=False, logits_to_keep=1)  # warm-up
        sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        sync(device)
        seconds = time.perf_counter() - t0
    return {"prefill_seconds": seconds, "prefill_tokens_per_second": n_tokens / seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["llama-3-8b", "llama-3-70b"], default="llama-3-8b")
    parser.add_argument("--layers", type=int, default=0, help="keep the first L layers (70B on one GPU)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of width 64 (smoke test)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", default="1,8,32,64")
    parser.add_argument("--context", default="1024,4096,16384,32768")
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--prefill-tokens", default="1024,4096")
    parser.add_argument("--headroom-gib", type=float, default=4.0,
                        help="GPU memory left free beside a cell's KV cache (activations, logits)")
    parser.add_argument("--compile", default="", metavar="MODE",
                        help="torch.compile the forward pass with this mode (reduce-overhead, max-autotune); "
                             "default: eager")
    parser.add_argument("--warmup-steps", type=int, help="untimed decode steps before each cell's timed ones "
                        "(default: 3 when compiled, 0 in eager mode)")
    parser.add_argument("--time-limit", type=float, default=0, help="seconds; later cells are skipped (0: none)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="JSON file of the results")
    args = parser.parse_args()

    start = time.perf_counter()
    device = torch.device(args.device)
    name = "tiny" if args.tiny else args.model
    config = make_config(name, 0 if args.tiny else args.layers)
    model = make_model(config, device, args.seed)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    compiled = None
    if args.compile:
        # Static shapes: a second batch size compiles its own graph instead of a dynamic one (CUDA graphs record
        # one shape each anyway).
        torch._dynamo.config.automatic_dynamic_shapes = False
        torch._dynamo.config.cache_size_limit = 64
        compiled = torch.compile(model.forward, mode=args.compile, fullgraph=True)
    n_warmup = args.warmup_steps if args.warmup_steps is not None else (3 if args.compile else 0)
    n_params = sum(p.numel() for p in model.parameters())
    report = {
        "command": " ".join([sys.executable] + sys.argv),
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "model": {"shape": name, "layers": config.num_hidden_layers, "d_model": config.hidden_size,
                  "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                  "vocab": config.vocab_size, "parameters": n_params, "weight_bytes": 2 * n_params},
        "dtype": "bfloat16", "attention": config._attn_implementation,
        "mode": f"torch.compile(mode={args.compile!r}, fullgraph=True)" if args.compile else "eager",
        "gen_tokens": args.gen_tokens, "warmup_steps": n_warmup,
        "context": "synthetic: the first N entries of a static cache of N + warmup_steps + gen_tokens hold random "
                   "keys and values",
        "setup_seconds": time.perf_counter() - start,
        "decode": [], "prefill": []}

    def out_of_time():
        return args.time_limit and time.perf_counter() - start > args.time_limit

    def record(kind, row):
        report[kind].append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)

    for n_tokens in numbers(args.prefill_tokens):
        row = {"tokens": n_tokens}
        if out_of_time():
            row["skipped"] = "time limit"
        else:
            try:
                row.update(prefill_cell(model, config, device, n_tokens, generator))
            except torch.OutOfMemoryError as e:
                row["skipped"] = f"out of memory: {str(e).splitlines()[0]}"
        record("prefill", row)
    for context in numbers(args.context):
        for batch in numbers(args.batch):
            row = {"batch": batch, "context": context}
            need = kv_bytes(config, batch, context + n_warmup + args.gen_tokens)
            free = free_bytes(device)
            if out_of_time():
                row["skipped"] = "time limit"
            elif free is not None and need + args.headroom_gib * 2**30 > free:
                row["skipped"] = f"the KV cache needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB are free"
            else:
                t0 = time.perf_counter()
                try:
                    row.update(decode_cell(model, compiled, config, device, batch, context, args.gen_tokens, n_warmup,
                                           generator))
                except torch.OutOfMemoryError as e:
                    row["skipped"] = f"out of memory: {str(e).splitlines()[0]}"
                except Exception as e:  # a compilation that fails says why, and the next cell still runs
                    if not args.compile:
                        raise
                    row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                row["cell_seconds"] = time.perf_counter() - t0
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            record("decode", row)
    report["total_seconds"] = time.perf_counter() - start
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
