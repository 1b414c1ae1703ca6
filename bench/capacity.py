#!/usr/bin/env python3
"""What KV compression turns into when memory is the limit: a fixed KV pool, many long prompts arriving at once.

  .venv/bin/python bench/capacity.py [--requests 64] [--prompt-tokens 4000] [--gen-tokens 128] [--memory-mib 256]
                                     [--chunk 512] [--runs full:f32,snapkv:int4,...] [--budget 128]
                                     [--out bench/results/cpu-capacity-chunked.json] [--png FILE]

For each run (a policy at --budget tokens a layer, or `full`, on an f32, f16, bf16 or int4 pool) it starts
`strata serve` with kv_cache.prefill_compression chunked (so that a prompt never needs its whole KV), sends
--requests streaming completions of --prompt-tokens distinct random token ids at once, each generating
--gen-tokens tokens (EOS ignored), and polls /metrics every half second, as an operator's Prometheus would, for
every layer's KV tokens, the pool's free blocks and the running and waiting sequences. Per run it reports:
  - the most sequences decoding at once (a request decodes from its first token to its last), and what the
    arithmetic allows: the pool's blocks over one sequence's peak as the scheduler counts it (each layer's budget
    plus a chunk and the scoring rows, in full-precision blocks; the whole prompt for `full`);
  - the pool's peak use, aggregate decode tokens/s (every generated token over the time from the first first
    token to the last token), total time and mean time to first token.
Raw results (with the /metrics timelines), the machine and the commands go to --out; --png draws, per run, every
layer's KV occupancy and the running sequences over time. Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench_support import free_port, machine, start_serve

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "strata"
CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
N_LAYERS = 30
DEFAULT_RUNS = ("full:f32,streaming:f32,h2o:f32,snapkv:f32,pyramidkv:f32,"
                "streaming:int4,h2o:int4,snapkv:int4,pyramidkv:int4")


def pyramid_budgets(n_layers: int, prompt: int, capacity: int, window: int = 8, beta: int = 20) -> list[int]:
    """PyramidKV's official integer schedule (../shared/specs/pyramidkv.md 3.4): entries kept per layer."""
    a = capacity - window
    if prompt < capacity:
        return [prompt] * n_layers
    if prompt < 2 * a:
        return [a + window] * n_layers
    lo, hi = a // beta, 2 * a - a // beta
    if hi >= prompt - window:
        hi, lo = prompt - window, 2 * a - (prompt - window)
    step = (hi - lo) // (n_layers - 1)
    return [hi - layer * step + window for layer in range(n_layers)]


def peak_blocks(policy: str, budget: int, prompt: int, chunk: int, block_size: int) -> int:
    """One sequence's peak in pool blocks as the scheduler counts it (cache/prefill_footprint.h)."""
    if policy == "full":
        kept = [None] * N_LAYERS
    elif policy == "pyramidkv":
        kept = pyramid_budgets(N_LAYERS, prompt, budget)
    else:
        kept = [budget] * N_LAYERS
    # SnapKV and PyramidKV score each chunk by the prompt's last `window` tokens run after it (their defaults).
    scoring = {"snapkv": 32, "pyramidkv": 8}.get(policy, 0)
    whole = max(prompt + 1, (prompt - 1) // chunk * chunk + scoring)
    entries = [whole if k is None else min(whole, k + chunk + scoring) for k in kept]
    return sum(-(-e // block_size) for e in entries)


def block_size(dtype: str) -> int:
    """A quantized pool's blocks are one KIVI group (32 entries); f32, f16 and bf16 pools keep the default 16."""
    return 32 if dtype.startswith("int") else 16


def start_server(port: int, policy: str, dtype: str, args) -> tuple[subprocess.Popen, list[str]]:
    spec = "full" if policy == "full" else f"{policy}:budget={args.budget}"
    sets = [f"kv_cache.memory_mib={args.memory_mib}", f"kv_cache.policy={spec}", f"kv_cache.dtype={dtype}",
            f"kv_cache.block_size={block_size(dtype)}", "kv_cache.prefill_compression=chunked",
            f"kv_cache.prefill_chunk={args.chunk}", "kv_cache.prefix_caching=off",
            f"engine.max_running={args.requests}", f"engine.max_waiting={max(256, args.requests)}",
            "server.access_log=false"]
    cmd = [str(BINARY), "serve", "--config", str(CONFIG), "--port", str(port)]
    for s in sets:
        cmd += ["--set", s]
    return start_serve(cmd, ROOT, port, 120), cmd


async def one_request(client: httpx.AsyncClient, url: str, prompt: list[int], gen_tokens: int, t0: float) -> dict:
    body = {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": gen_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    first = last = None
    n = 0
    async with client.stream("POST", url, json=body, timeout=None) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread()).decode()[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                now = time.perf_counter() - t0
                first = now if first is None else first
                last = now
                n += 1
    return {"first_token_s": first, "last_token_s": last, "chunks": n}


def sample_metrics(text: str) -> dict:
    layers = [0.0] * N_LAYERS
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "strata_kv_layer_tokens":
                layers[int(s.labels["layer"])] += s.value
            elif s.name in ("strata_kv_blocks_free", "strata_kv_blocks_total", "strata_requests_running",
                            "strata_requests_waiting"):
                out[s.name[len("strata_"):]] = out.get(s.name[len("strata_"):], 0) + s.value
    out = {k: int(v) for k, v in out.items()}
    out["layer_tokens"] = [int(t) for t in layers]
    return out


async def poll(client: httpx.AsyncClient, base: str, t0: float, samples: list, done: asyncio.Event) -> None:
    while not done.is_set():
        try:
            response = await client.get(f"{base}/metrics", timeout=30)
            samples.append({"t": round(time.perf_counter() - t0, 3), **sample_metrics(response.text)})
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)


async def workload(port: int, prompts: list[list[int]], gen_tokens: int) -> tuple[list[dict], list[dict], float]:
    base = f"http://127.0.0.1:{port}"
    samples: list[dict] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=len(prompts) + 4)) as client:
        t0 = time.perf_counter()
        poller = asyncio.create_task(poll(client, base, t0, samples, done))
        requests = await asyncio.gather(*(one_request(client, f"{base}/v1/completions", p, gen_tokens, t0)
                                          for p in prompts))
        total = time.perf_counter() - t0
        done.set()
        await poller
    return requests, samples, total


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def summarize(requests: list[dict], samples: list[dict], total: float, gen_tokens: int, peak: int) -> dict:
    firsts = [r["first_token_s"] for r in requests]
    lasts = [r["last_token_s"] for r in requests]
    blocks_total = int(max(s.get("kv_blocks_total", 0) for s in samples))
    least_free = min(s.get("kv_blocks_free", blocks_total) for s in samples)
    decode_span = max(lasts) - min(firsts)
    return {
        "max_decoding_at_once": most_at_once(list(zip(firsts, lasts))),
        "max_running": max(s.get("requests_running", 0) for s in samples),
        "arithmetic_sequences": int(blocks_total // peak),
        "peak_blocks_per_sequence": peak,
        "pool_blocks": blocks_total,
        "pool_peak_use": (blocks_total - least_free) / blocks_total,
        "generated_tokens": gen_tokens * len(requests),
        "decode_seconds": decode_span,
        "decode_tokens_per_second": gen_tokens * len(requests) / decode_span,
        "total_seconds": total,
        "mean_ttft_seconds": statistics.mean(firsts),
    }


def draw(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(3.2 * len(runs), 6), squeeze=False, sharey="row",
                             gridspec_kw={"height_ratios": [3, 2]})
    vmax = max(max(max(s["layer_tokens"]) for s in r["timeline"]) for r in runs.values())
    for col, (name, run) in enumerate(runs.items()):
        t = [s["t"] for s in run["timeline"]]
        grid = [[s["layer_tokens"][layer] for s in run["timeline"]] for layer in range(N_LAYERS)]
        ax = axes[0][col]
        image = ax.imshow(grid, aspect="auto", origin="lower", extent=[t[0], t[-1], -0.5, N_LAYERS - 0.5],
                          vmin=0, vmax=vmax, cmap="viridis")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("s")
        ax = axes[1][col]
        ax.plot(t, [s.get("requests_running", 0) for s in run["timeline"]], label="running")
        ax.plot(t, [s.get("requests_waiting", 0) for s in run["timeline"]], label="waiting", alpha=0.6)
        ax.set_xlabel("s")
    axes[0][0].set_ylabel("layer (KV tokens held)")
    axes[1][0].set_ylabel("sequences")
    axes[1][0].legend(fontsize=8)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="tokens")
    fig.suptitle(f"{report['requests']} x {report['prompt_tokens']}-token prompts, {report['gen_tokens']} generated, "
                 f"{report['memory_mib']} MiB KV pool, chunked prefill ({report['chunk']}), from /metrics",
                 fontsize=10)
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--memory-mib", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--runs", default=DEFAULT_RUNS, help="policy:dtype, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu-capacity-chunked.json"))
    parser.add_argument("--png", default=None, help="default: --out with .png")
    args = parser.parse_args()

    rng = random.Random(20261128)
    prompts = [[1] + [rng.randrange(300, 40000) for _ in range(args.prompt_tokens - 1)]
               for _ in range(args.requests)]
    report = {"what": __doc__.split("\n\n")[0].strip(), "machine": machine(),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip(),
              "command": "bench/capacity.py " + " ".join(sys.argv[1:]), "requests": args.requests,
              "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "memory_mib": args.memory_mib,
              "chunk": args.chunk, "budget": args.budget, "runs": {}}
    for run in args.runs.split(","):
        policy, dtype = run.split(":")
        port = free_port()
        process, cmd = start_server(port, policy, dtype, args)
        try:
            requests, samples, total = asyncio.run(workload(port, prompts, args.gen_tokens))
        finally:
            process.terminate()
            process.wait(timeout=60)
        peak = peak_blocks(policy, args.budget, args.prompt_tokens, args.chunk, block_size(dtype))
        result = summarize(requests, samples, total, args.gen_tokens, peak)
        print(f"{run:16s} decoding at once {result['max_decoding_at_once']:3d} (arithmetic "
              f"{result['arithmetic_sequences']}), pool peak {result['pool_peak_use']:.2f}, decode "
              f"{result['decode_tokens_per_second']:.1f} tok/s, total {total:.0f} s, "
              f"ttft {result['mean_ttft_seconds']:.1f} s", flush=True)
        report["runs"][run] = {**result, "server_command": " ".join(cmd), "requests": requests, "timeline": samples}
        Path(args.out).write_text(json.dumps(report, separators=(",", ":")))
    if "full:f32" in report["runs"]:
        base = report["runs"]["full:f32"]["decode_tokens_per_second"]
        report["decode_ratio_to_full_f32"] = {k: r["decode_tokens_per_second"] / base
                                              for k, r in report["runs"].items()}
    Path(args.out).write_text(json.dumps(report, separators=(",", ":")))  # compact: the timelines are long
    draw(report, args.png or str(Path(args.out).with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
