#!/usr/bin/env python3
"""Prefix caching, on against off, over HTTP on `strata serve` (one server after the other, same machine):

  .venv/bin/python bench/prefix_cache.py [--requests 32] [--prefix-tokens 1500] [--question-tokens 50]
                                         [--max-tokens 16] [--out bench/results/cpu-prefix-cache.json]

The workload is a long shared document (a system prompt, a contract, a code base) asked many questions at once:
one warm-up request with the document and its own question, then --requests concurrent streaming requests of the
document followed by each one's question (token ids from the committed test texts). For each configuration (the
server's `full`, and every request asking for PyramidKV at 128 tokens per layer, to show that compression and the
cache add up) it runs the server with kv_cache.prefix_caching on and then off, and records each request's time to
first token and the wall time of all of them. Raw results, the machine and the commands go to --out.
Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench_support import (BINARY, ROOT, commit, document_and_questions, free_port, machine, one_request,
                           start_serve)

CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
POLICIES = {"full": None, "pyramidkv-128": {"policy": "pyramidkv", "budget": 128}}


def start_server(port: int, prefix_caching: str) -> tuple[subprocess.Popen, list[str]]:
    cmd = [str(BINARY), "serve", "--config", str(CONFIG), "--port", str(port),
           "--set", f"kv_cache.prefix_caching={prefix_caching}"]
    return start_serve(cmd, ROOT, port, 60), cmd


async def workload(port: int, prefix: list[int], questions: list[list[int]], warm_question: list[int],
                   kv_compression: dict | None, max_tokens: int) -> dict:
    url = f"http://127.0.0.1:{port}/v1/completions"

    def body(question):
        b = {"model": "SmolLM2-135M-Instruct", "prompt": prefix + question, "max_tokens": max_tokens,
             "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        if kv_compression:
            b["kv_compression"] = kv_compression
        return b

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=len(questions) + 1)) as client:
        await one_request(client, url, body(warm_question))
        start = time.perf_counter()
        results = await asyncio.gather(*(one_request(client, url, body(q)) for q in questions))
        wall = time.perf_counter() - start
    ttfts = [r["ttft_s"] for r in results]
    return {"wall_s": wall, "ttft_mean_s": statistics.mean(ttfts), "ttft_median_s": statistics.median(ttfts),
            "ttft_max_s": max(ttfts), "cached_tokens": [r["cached_tokens"] for r in results], "requests": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--question-tokens", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu-prefix-cache.json"))
    args = parser.parse_args()

    prefix, questions = document_and_questions(args.prefix_tokens, args.question_tokens, args.requests + 1)

    runs = {}
    for name, kv in POLICIES.items():
        for caching in ("on", "off"):
            port = free_port()
            process, cmd = start_server(port, caching)
            try:
                result = asyncio.run(workload(port, prefix, questions[1:], questions[0], kv, args.max_tokens))
            finally:
                process.terminate()
                process.wait(timeout=60)
            result["server_command"] = " ".join(cmd)
            runs[f"{name}, cache {caching}"] = result
            print(f"{name:14s} cache {caching:3s}: ttft mean {result['ttft_mean_s']:.3f} s, "
                  f"max {result['ttft_max_s']:.3f} s, wall {result['wall_s']:.2f} s", flush=True)
    ratios = {}
    for name in POLICIES:
        on, off = runs[f"{name}, cache on"], runs[f"{name}, cache off"]
        ratios[f"{name}: ttft mean off / on"] = off["ttft_mean_s"] / on["ttft_mean_s"]
        ratios[f"{name}: wall off / on"] = off["wall_s"] / on["wall_s"]
    for k, v in ratios.items():
        print(f"{k:40s} {v:7.2f}")
    report = {"what": "prefix caching on against off: one warm-up request, then concurrent streaming requests of a "
                      "shared document followed by each one's question", "commit": commit(), "machine": machine(),
              "command": "bench/prefix_cache.py " + " ".join(sys.argv[1:]),
              "requests": args.requests, "prefix_tokens": args.prefix_tokens,
              "question_tokens": args.question_tokens, "max_tokens": args.max_tokens,
              "ratios": ratios, "runs": runs}
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
