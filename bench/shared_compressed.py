#!/usr/bin/env python3
"""A compressed document shared between requests ([shared-compressed]), over HTTP on `strata serve`:

  .venv/bin/python bench/shared_compressed.py [--requests 32] [--doc-tokens 1500] [--question-tokens 30]
                                              [--max-tokens 32] [--chunk 64] [--budget 25%] [--memory-mib 3072]
                                              [--dtype f32] [--policy expected_attention]
                                              [--out bench/results/cpu-shared-compressed.json]

The workload: many questions at once on one long document, each request asking for a query-agnostic policy
(--policy: Expected Attention or KVzip) at --budget
(`"kv_compression": {"policy": "expected_attention", "budget": "25%"}`). The document is the first --doc-tokens
token ids of tests/fixtures/texts/the_keepers_ledger.txt, the questions consecutive --question-tokens slices of
a_coastal_almanac.txt; each prompt is the document followed by its question (completions, token ids, temperature
0, EOS ignored, --max-tokens tokens, streamed with usage and logprobs 0), on a pool of --dtype (a quantized one
with blocks of 32 tokens, a sealed group each). Each run is a fresh server, one after
the other, sending one warm-up request (its own question) and then --requests questions at once:
  - `shared`: kv_cache.prefill_compression chunked (a compression every --chunk prompt tokens), prefix caching
    on: the warm-up publishes its compressed document at its prompt's last compression point (the last multiple
    of --chunk below its end) and every question starts from those blocks (cached_tokens = that point);
  - `copies`: the same with prefix caching off, what a server did before: each request prefills and compresses
    the document itself and holds its own compressed copy;
  - `today's cache hit`: SnapKV at --budget with the prompt compressed once whole (prefill_compression end),
    prefix caching on: a compressing policy's cache hit before [shared-compressed] (each request starts from a
    copy of the cached, uncompressed document and compresses it).
During the concurrent phase /metrics is polled every 0.1 s (strata_kv_blocks_total − strata_kv_blocks_free: the
pool's blocks in use, one block holding --block-size tokens of one layer; cached blocks count as used), and
/v1/kv_state is read once when every request has its first token. Then `alone`: a fresh server in the `copies`
configuration answers each question alone, one after the other, and the answers of `shared` and `copies` are
compared with those, text and tokens.

Goals (the issue): what the requests hold together in `shared` (the pool's peak, every request decoding at once)
at most 1/4 of what they hold with `copies` (--requests times one request's blocks: that run never holds them all
at once); time to first token at least as good
as `today's cache hit`; every answer the one the request gets alone. Raw results (per request: time to first token,
end, cached_tokens, text, tokens; the /metrics samples; /v1/kv_state), the machine, the commit and the server
commands go to --out. Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench_support import (BINARY, ROOT, commit, document_and_questions, free_port, machine, one_request,
                           start_serve)

CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
MODEL_NAME = "SmolLM2-135M-Instruct"
GAUGES = ("strata_kv_blocks_free", "strata_kv_blocks_total", "strata_prefix_cache_blocks",
          "strata_requests_running", "strata_requests_waiting")


def kv_sequences(run: dict) -> list[dict]:
    """The sequences of the run's /v1/kv_state snapshot (taken when every request had its first token)."""
    return (run["kv_state_while_decoding"] or {}).get("state", {}).get("sequences", [])


def runs(policy: str, budget: str) -> dict:
    """name: (the request's kv_compression, chunked prefill compression, prefix caching)."""
    agnostic = {"policy": policy, "budget": budget}
    return {"shared": (agnostic, True, "on"), "copies": (agnostic, True, "off"),
            "today's cache hit": ({"policy": "snapkv", "budget": budget}, False, "on")}


def server_command(port: int, chunked: bool, caching: str, args) -> list[str]:
    sets = [f"kv_cache.prefix_caching={caching}", f"kv_cache.memory_mib={args.memory_mib}",
            f"engine.max_running={max(64, args.requests + 1)}", "server.access_log=false",
            f"kv_cache.dtype={args.dtype}"]
    if args.dtype != "f32":
        sets.append(f"kv_cache.block_size={args.block_size}")
    if chunked:
        sets += ["kv_cache.prefill_compression=chunked", f"kv_cache.prefill_chunk={args.chunk}"]
    else:
        sets.append("kv_cache.prefill_compression=end")  # the default, auto, would chunk SnapKV too
    cmd = [str(BINARY), "serve", "--config", str(CONFIG), "--port", str(port)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def request_body(prompt: list[int], kv_compression: dict, max_tokens: int) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "logprobs": 0,
            "kv_compression": kv_compression}


def sample_metrics(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in GAUGES:
                out[s.name[len("strata_"):]] = out.get(s.name[len("strata_"):], 0) + int(s.value)
    return out


async def read_metrics(client: httpx.AsyncClient, base: str) -> dict:
    return sample_metrics((await client.get(f"{base}/metrics", timeout=30)).text)


async def poll(client: httpx.AsyncClient, base: str, t0: float, samples: list, done: asyncio.Event) -> None:
    while not done.is_set():
        try:
            samples.append({"t": round(time.perf_counter() - t0, 3), **await read_metrics(client, base)})
        except httpx.HTTPError:
            pass
        try:
            await asyncio.wait_for(done.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


async def concurrent(port: int, prompts: list[list[int]], warm_prompt: list[int], kv_compression: dict,
                     max_tokens: int) -> dict:
    """The warm-up request, then every prompt at once, with /metrics polled and /v1/kv_state read once."""
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/completions"
    samples: list[dict] = []
    done = asyncio.Event()
    all_first = asyncio.Event()
    n_first = 0

    def first_token():
        nonlocal n_first
        n_first += 1
        if n_first == len(prompts):
            all_first.set()

    async def kv_state_when_all_decode():
        await all_first.wait()
        response = await client.get(f"{base}/v1/kv_state", timeout=60)
        return {"t": round(time.perf_counter() - t0, 3), "state": response.json()}

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=len(prompts) + 4)) as client:
        warm = await one_request(client, url, request_body(warm_prompt, kv_compression, max_tokens))
        before = await read_metrics(client, base)
        t0 = time.perf_counter()
        poller = asyncio.create_task(poll(client, base, t0, samples, done))
        state = asyncio.create_task(kv_state_when_all_decode())
        results = await asyncio.gather(*(one_request(client, url, request_body(p, kv_compression, max_tokens),
                                                     first_token) for p in prompts))
        wall = time.perf_counter() - t0
        done.set()
        await poller
        kv_state = None
        if all_first.is_set():
            kv_state = await asyncio.wait_for(state, 120)
        else:  # some request ended without text
            state.cancel()
        after = await read_metrics(client, base)
        final = [s for f in text_string_to_metric_families((await client.get(f"{base}/metrics", timeout=30)).text)
                 for s in f.samples]
        counters = {s.name: s.value for s in final
                    if s.name.startswith("strata_prefix_cache") or s.name == "strata_preemptions_total"}
        build = next((s.labels for s in final if s.name == "strata_build_info"), None)
    in_use = [s["kv_blocks_total"] - s["kv_blocks_free"] for s in samples if "kv_blocks_free" in s]
    ttfts = [r["ttft_s"] for r in results]
    return {"wall_s": wall, "ttft_mean_s": statistics.mean(ttfts), "ttft_median_s": statistics.median(ttfts),
            "ttft_max_s": max(ttfts), "peak_blocks_in_use": max(in_use),
            "blocks_in_use_before": before["kv_blocks_total"] - before["kv_blocks_free"],
            "blocks_in_use_after": after["kv_blocks_total"] - after["kv_blocks_free"],
            "blocks_total": before["kv_blocks_total"], "n_metrics_samples": len(in_use),
            "cached_tokens": [r["cached_tokens"] for r in results], "counters_after": counters,
            "build_info": build, "warm_up": warm, "requests": results, "metrics_samples": samples, "kv_state_while_decoding": kv_state}


async def sequential(port: int, prompts: list[list[int]], kv_compression: dict, max_tokens: int) -> list[dict]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    async with httpx.AsyncClient() as client:
        return [await one_request(client, url, request_body(p, kv_compression, max_tokens)) for p in prompts]


def with_server(cmd: list[str], port: int, work):
    process = start_serve(cmd, ROOT, port, 120)
    try:
        return asyncio.run(work)
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--doc-tokens", type=int, default=1500)
    parser.add_argument("--question-tokens", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=64,
                        help="kv_cache.prefill_chunk of the chunked runs: the tail prefilled on top of the shared "
                             "document is under a chunk plus the question")
    parser.add_argument("--budget", default="25%", help="the budget of both policies, as the API takes it")
    parser.add_argument("--memory-mib", type=int, default=3072,
                        help="the pool: enough that no run waits for memory (today's cache hit holds every "
                             "prompt whole until it is compressed: 32 x 1,530 tokens x 30 layers at f32 is 2.3 GiB)")
    parser.add_argument("--dtype", default="f32", choices=["f32", "int8", "int4", "int2"], help="kv_cache.dtype")
    parser.add_argument("--policy", default="expected_attention", choices=["expected_attention", "kvzip"],
                        help="the query-agnostic policy of the shared and copies runs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu-shared-compressed.json"))
    args = parser.parse_args()
    args.block_size = 16 if args.dtype == "f32" else 32  # the config's, or a quantized pool's group

    document, questions = document_and_questions(args.doc_tokens, args.question_tokens, args.requests + 1)
    n = args.question_tokens
    prompts = [document + q for q in questions[1:]]
    prompt_len = args.doc_tokens + n
    point = (prompt_len - 1) // args.chunk * args.chunk  # the prompt's last compression point, below its end
    if point > args.doc_tokens:
        print(f"warning: the last compression point {point} falls in the question: nothing can be shared",
              file=sys.stderr)
    # What every layer holds after the last point (Budget::resolve rounds a share up) must fill whole blocks.
    kept = math.ceil(point * float(args.budget[:-1]) / 100) if args.budget.endswith("%") else int(args.budget)
    if kept % args.block_size:
        print(f"warning: {args.budget} of the {point} tokens before the last compression point is {kept} entries, "
              f"not whole blocks of {args.block_size}: the compressed document cannot be shared", file=sys.stderr)

    report_runs = {}
    commands = {}
    for name, (kv, chunked, caching) in runs(args.policy, args.budget).items():
        port = free_port()
        cmd = server_command(port, chunked, caching, args)
        started = time.perf_counter()
        result = with_server(cmd, port, concurrent(port, prompts, document + questions[0], kv, args.max_tokens))
        result["server_command"] = commands[name] = " ".join(cmd)
        result["kv_compression"] = kv
        report_runs[name] = result
        sequences = kv_sequences(result)
        result["kv_state_summary"] = {"sequences": len(sequences),
                                      "prefix_blocks_shared": [q.get("prefix_blocks_shared") for q in sequences],
                                      "prefix_compressed": [q.get("prefix_compressed") for q in sequences]}
        print(f"{name:18s}: ttft mean {result['ttft_mean_s']:.3f} s, median {result['ttft_median_s']:.3f} s, "
              f"max {result['ttft_max_s']:.3f} s, wall {result['wall_s']:.2f} s, peak blocks in use "
              f"{result['peak_blocks_in_use']} (before {result['blocks_in_use_before']}), cached_tokens "
              f"{sorted(set(result['cached_tokens']))} (last compression point {point}), /v1/kv_state while "
              f"decoding: {len(sequences)} sequences, prefix_blocks_shared "
              f"{sorted(set(result['kv_state_summary']['prefix_blocks_shared']), key=str)}, preemptions "
              f"{result['counters_after'].get('strata_preemptions_total', 0):.0f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)

    kv, chunked, caching = runs(args.policy, args.budget)["copies"]
    port = free_port()
    cmd = server_command(port, chunked, caching, args)
    started = time.perf_counter()
    alone = with_server(cmd, port, sequential(port, prompts, kv, args.max_tokens))
    commands["alone"] = " ".join(cmd)
    print(f"{'alone':18s}: {len(alone)} questions one after the other ({time.perf_counter() - started:.0f} s)",
          flush=True)

    def same(run: str) -> dict:
        got = report_runs[run]["requests"]
        return {"text": sum(g["text"] == a["text"] for g, a in zip(got, alone)),
                "tokens": sum(g["tokens"] == a["tokens"] for g, a in zip(got, alone)),
                "differ": [i for i, (g, a) in enumerate(zip(got, alone)) if g["tokens"] != a["tokens"]]}

    shared, copies, today = (report_runs[k] for k in ("shared", "copies", "today's cache hit"))
    answers_equal = {"of": args.requests, "shared = alone": same("shared"), "copies = alone": same("copies")}
    # `copies` never holds every request at once (each prefills and compresses the whole document, so the first
    # ones finish before the last ones start): what its requests would hold together is --requests times what one
    # of them holds, read from /v1/kv_state (the sequence furthest into its answer, a lower bound of a request's
    # final footprint). `shared` is measured: every request was decoding at once (its /v1/kv_state lists them).
    per_request = max((sum(layer["blocks"] for layer in q["layers"]) for q in kv_sequences(copies)), default=0)
    copies["blocks_per_request"] = per_request
    copies["blocks_together"] = per_request * args.requests
    ratios = {"blocks held by the requests together: shared (measured peak) / copies (requests x one's blocks) "
              "(goal <= 0.25)": shared["peak_blocks_in_use"] / copies["blocks_together"],
              "peak blocks in use: shared / copies": shared["peak_blocks_in_use"] / copies["peak_blocks_in_use"],
              "ttft mean: shared / today's cache hit (goal <= 1)": shared["ttft_mean_s"] / today["ttft_mean_s"],
              "ttft median: shared / today's cache hit (goal <= 1)": shared["ttft_median_s"] / today["ttft_median_s"],
              "ttft mean: shared / copies": shared["ttft_mean_s"] / copies["ttft_mean_s"],
              "ttft median: shared / copies": shared["ttft_median_s"] / copies["ttft_median_s"],
              "wall: shared / copies": shared["wall_s"] / copies["wall_s"],
              "wall: shared / today's cache hit": shared["wall_s"] / today["wall_s"]}
    for k, v in ratios.items():
        print(f"{k:55s} {v:7.3f}")
    for k in ("shared = alone", "copies = alone"):
        e = answers_equal[k]
        print(f"answers {k}: {e['tokens']} of {args.requests} (tokens), {e['text']} (text)"
              + (f", differ: {e['differ']}" if e["differ"] else ""))
    report = {"what": f"a compressed document shared between concurrent requests: {args.policy} with chunked "
                      "prefill compression and prefix caching on (shared) against off (copies), against SnapKV's "
                      "cache hit with the prompt compressed whole (today's cache hit); answers against each "
                      "question alone",
              "commit": commit(), "machine": machine(),
              "command": "bench/shared_compressed.py " + " ".join(sys.argv[1:]),
              "requests": args.requests, "doc_tokens": args.doc_tokens, "question_tokens": n,
              "max_tokens": args.max_tokens, "chunk": args.chunk, "policy": args.policy, "budget": args.budget,
              "memory_mib": args.memory_mib, "kv_dtype": args.dtype, "block_size": args.block_size,
              "prompt_tokens": prompt_len, "last_compression_point": point,
              "server_commands": commands, "ratios": ratios, "answers_equal": answers_equal,
              "runs": report_runs, "alone": alone}
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
