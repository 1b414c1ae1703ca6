#!/usr/bin/env python3
"""Structured output's cost over HTTP on `strata serve`: decode tokens/s at batch 1 and 8 with and without a
schema. (The time to compile a schema and to compute masks is timed alone by build/bench/schema_compile.)

  .venv/bin/python bench/structured_output.py [--max-tokens 128] [--repeats 3]
                                              [--out bench/results/cpu-structured-output.json]

Each batch runs `batch` concurrent streaming chat requests on the same prompt, greedy, with `max_tokens` tokens:
  free      no response_format, ignore_eos, so every request decodes max_tokens tokens;
  json      response_format json_object (free strings: the mask cache hits inside them);
  schema    a list of 8 objects with two bounded strings each (a bounded string changes the parser state at every
            character: the mask is computed afresh at nearly every step, the costly case), long enough that the
            document is never complete within max_tokens.
A request's decode rate is (tokens - 1) over the time from its first to its last token; a batch's is the sum over
its requests of tokens - 1 over the span from the first first token to the last last token. The three modes
alternate, repeats times, on one server. Run it on an otherwise idle machine.
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

from bench_support import free_port, machine, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "strata"
CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
PROMPT = "List eight famous scientists with a short note on each, as JSON."
LIST_SCHEMA = {"type": "object", "properties": {"items": {
    "type": "array", "minItems": 8, "maxItems": 8, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                         "note": {"type": "string", "maxLength": 80}},
        "required": ["name", "note"]}}}, "required": ["items"]}
MODES = {
    "free": {"ignore_eos": True},
    "json": {"response_format": {"type": "json_object"}},
    "schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "list", "schema": LIST_SCHEMA}}},
}


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    times = []
    tokens = None
    finish = None
    async with client.stream("POST", url, json=body, timeout=600) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    times.append(time.perf_counter())
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"tokens": tokens, "first": times[0], "last": times[-1], "finish_reason": finish}


async def batch_run(port: int, batch: int, mode: str, max_tokens: int) -> dict:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            **MODES[mode]}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=batch + 1)) as client:
        results = await asyncio.gather(*(one_request(client, url, body) for _ in range(batch)))
    span = max(r["last"] for r in results) - min(r["first"] for r in results)
    decoded = sum(r["tokens"] - 1 for r in results)
    return {"decode_tokens_per_s": decoded / span, "tokens": [r["tokens"] for r in results],
            "finish_reasons": [r["finish_reason"] for r in results],
            "per_request_tokens_per_s": [(r["tokens"] - 1) / (r["last"] - r["first"]) for r in results]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu-structured-output.json"))
    args = parser.parse_args()

    port = free_port()
    cmd = [str(BINARY), "serve", "--config", str(CONFIG), "--port", str(port)]
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: dict[str, list[dict]] = {}
    try:
        wait_healthy(process, port, 60)
        asyncio.run(batch_run(port, 1, "free", 8))  # warm-up
        for batch in [int(b) for b in args.batches.split(",")]:
            for repeat in range(args.repeats):
                for mode in MODES:
                    result = asyncio.run(batch_run(port, batch, mode, args.max_tokens))
                    runs.setdefault(f"batch {batch}, {mode}", []).append(result)
                    print(f"batch {batch} {mode:6s} #{repeat}: {result['decode_tokens_per_s']:7.1f} tokens/s "
                          f"{result['finish_reasons'][0]}", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=60)
    summary = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        free = statistics.median(r["decode_tokens_per_s"] for r in runs[f"batch {batch}, free"])
        for mode in ("json", "schema"):
            constrained = statistics.median(r["decode_tokens_per_s"] for r in runs[f"batch {batch}, {mode}"])
            summary[f"batch {batch}: {mode} / free"] = constrained / free
        summary[f"batch {batch}: free tokens/s (median)"] = free
    for k, v in summary.items():
        print(f"{k:36s} {v:8.3f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    report = {"what": "decode tokens/s with and without a schema (streaming chat, greedy, same prompt)",
              "commit": commit, "machine": machine(), "command": "bench/structured_output.py " + " ".join(sys.argv[1:]),
              "server_command": " ".join(cmd), "max_tokens": args.max_tokens, "schema": LIST_SCHEMA,
              "summary": summary, "runs": runs}
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
