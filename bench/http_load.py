#!/usr/bin/env python3
"""Loads an OpenAI-compatible server with concurrent streaming /v1/completions requests and measures it.

For each entry of --streams (e.g. "1,8") it runs that many concurrent streams; each stream sends --rounds requests
one after the other, each asking for --max-tokens tokens at temperature 0 with "stream": true. It reports, per case,
the aggregate completion tokens per second over the wall time of all streams (first request sent to last stream
ended) and the mean time to first token (request sent to the first streamed chunk that carries text).

Every request gets the same number of prompt tokens, sent as token ids (both Strata and llama-server accept an
array of ids as "prompt"), so that both servers see exactly the same prompts whatever their tokenizers add: the
ids of a fixed English text (tokenized once by --tokenizer, e.g. `build/strata tokenize --model M`), each request
starting a few tokens further into it, so that no request shares a prefix with another and no prefix cache can
skip a prefill. A short warm-up request runs before the measured ones.

Tokens are counted from the usage block the server sends at the end of the stream (stream_options.include_usage),
and from the streamed chunks that carry text; both counts are recorded, and the usage one is used when present.

Used by bench/cpu_vs_llamacpp.sh; it can also be run alone:
  .venv/bin/python bench/http_load.py --url http://127.0.0.1:8000 --model SmolLM2-135M-Instruct \
      --tokenizer "build/strata tokenize --model models/SmolLM2-135M-Instruct.Q4_1.gguf" --streams 1,8 --out r.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
import time

import httpx

# A fixed, natural text: the prompt of every request is a window of its token ids (repeated if needed).
BASE_TEXT = (
    "The history of the lighthouse is a long story of people who kept a light burning for strangers. "
    "In the ancient world, fires were lit on hills and towers near harbours so that ships coming home at night "
    "could find the entrance. The most famous of them stood on the island of Pharos, outside Alexandria, and was "
    "counted among the wonders of the world. Later, in the eighteenth and nineteenth centuries, engineers learned "
    "to build towers on bare rocks far out at sea, where the waves break with enormous force. They used granite "
    "blocks cut to lock into one another, so that the whole tower behaved like a single stone. The keepers lived "
    "in small rooms under the lantern, trimmed the wicks, polished the lenses and wound the clockwork that turned "
    "the light. Their days were quiet and their nights were long, and in storms they could not leave for weeks. "
    "Today most lighthouses are automatic, watched from far away, but many people still visit them and wonder "
    "what it was like to live there. Write a detailed account of a single winter night in such a lighthouse, "
    "from the moment the keeper lights the lamp until the morning, describing the weather, the sea, the ships "
    "that pass and the small tasks that fill the hours. "
)


def tokenize(tokenizer_cmd: str, text: str) -> list[int]:
    out = subprocess.run(shlex.split(tokenizer_cmd), input=json.dumps(text), capture_output=True, text=True,
                         check=True).stdout
    ids = json.loads(out)
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise SystemExit(f"http_load: the tokenizer printed {out[:200]!r}, not a list of token ids")
    return ids


def prompts(base: list[int], n_tokens: int, count: int) -> list[list[int]]:
    """`count` windows of `n_tokens` ids of the base text, each starting 3 tokens after the previous one."""
    stride = 3
    need = n_tokens + stride * count
    ids = (base * (need // len(base) + 1))[:need]
    return [ids[stride * k: stride * k + n_tokens] for k in range(count)]


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    first_event = first_text = None
    text_chunks = 0
    usage = None
    finish_reason = None
    text = []
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread()).decode(errors="replace")[:500]
            raise RuntimeError(f"POST /v1/completions answered {resp.status_code}: {detail}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            now = time.perf_counter()
            if first_event is None:
                first_event = now
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                piece = choice.get("text") or ""
                if piece:
                    text_chunks += 1
                    text.append(piece)
                    if first_text is None:
                        first_text = now
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
    t1 = time.perf_counter()
    completion_tokens = usage.get("completion_tokens") if usage else None
    return {
        "start_s": t0,
        "end_s": t1,
        "seconds": t1 - t0,
        "ttft_s": (first_text if first_text is not None else t1) - t0,
        "first_event_s": (first_event if first_event is not None else t1) - t0,
        "text_chunks": text_chunks,
        "usage": usage,
        "completion_tokens": completion_tokens if completion_tokens is not None else text_chunks,
        "tokens_from": "usage" if completion_tokens is not None else "chunks",
        "finish_reason": finish_reason,
        "text": "".join(text),
    }


async def run_case(url: str, streams: int, rounds: int, make_body, timeout: float) -> dict:
    limits = httpx.Limits(max_connections=streams + 1, max_keepalive_connections=streams + 1)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def stream(s: int) -> list[dict]:
            out = []
            for r in range(rounds):
                res = await one_request(client, url, make_body(s * rounds + r))
                res.update(stream=s, round=r)
                out.append(res)
            return out

        t0 = time.perf_counter()
        per_stream = await asyncio.gather(*(stream(s) for s in range(streams)))
        t1 = time.perf_counter()
    requests = [r for rs in per_stream for r in rs]
    for r in requests:  # relative to the start of the case
        r["start_s"] -= t0
        r["end_s"] -= t0
    tokens = sum(r["completion_tokens"] for r in requests)
    wall = t1 - t0
    return {
        "streams": streams,
        "rounds": rounds,
        "requests": len(requests),
        "wall_seconds": wall,
        "completion_tokens": tokens,
        "completion_tokens_per_second": tokens / wall if wall > 0 else None,
        "mean_ttft_seconds": statistics.fmean(r["ttft_s"] for r in requests),
        "median_ttft_seconds": statistics.median(r["ttft_s"] for r in requests),
        "mean_request_seconds": statistics.fmean(r["seconds"] for r in requests),
        "every_request_got_max_tokens": None,  # filled in by main
        "per_request": requests,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--model", default="auto", help='the "model" field of each request (auto: the first id '
                    "that GET /v1/models lists)")
    ap.add_argument("--tokenizer", required=True,
                    help="a command that reads a JSON string on stdin and prints its token ids as a JSON list")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--streams", default="1,8", help="comma-separated concurrent stream counts, one case each")
    ap.add_argument("--rounds", type=int, default=3, help="requests each stream sends one after the other")
    ap.add_argument("--warmup-tokens", type=int, default=8, help="max_tokens of the warm-up request (0: none)")
    ap.add_argument("--no-ignore-eos", action="store_true",
                    help='leave out "ignore_eos": true (then a request may stop before --max-tokens)')
    ap.add_argument("--extra", default="{}", help="a JSON object merged into every request body")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    stream_counts = [int(s) for s in a.streams.split(",") if s]
    extra = json.loads(a.extra)

    if a.model == "auto":
        listed = httpx.get(a.url + "/v1/models", timeout=30).json()
        a.model = listed["data"][0]["id"]
    base = tokenize(a.tokenizer, BASE_TEXT)
    total = 1 + sum(n * a.rounds for n in stream_counts)
    windows = prompts(base, a.prompt_tokens, total)

    def body(index: int, max_tokens: int) -> dict:
        b = {"model": a.model, "prompt": windows[index], "max_tokens": max_tokens, "temperature": 0,
             "stream": True, "stream_options": {"include_usage": True}}
        if not a.no_ignore_eos:
            b["ignore_eos"] = True
        b.update(extra)
        return b

    result = {"url": a.url, "model": a.model, "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens,
              "ignore_eos": not a.no_ignore_eos, "extra_body": extra, "tokenizer": a.tokenizer,
              "base_text": BASE_TEXT, "base_text_tokens": len(base),
              "request_body_example": body(1, a.max_tokens), "cases": []}
    if a.warmup_tokens > 0:
        result["warmup"] = asyncio.run(run_case(a.url, 1, 1, lambda i: body(0, a.warmup_tokens), a.timeout))
    offset = 1
    for n in stream_counts:
        start = offset
        case = asyncio.run(run_case(a.url, n, a.rounds, lambda i, s=start: body(s + i, a.max_tokens), a.timeout))
        offset += n * a.rounds
        case["every_request_got_max_tokens"] = all(r["completion_tokens"] == a.max_tokens
                                                    for r in case["per_request"])
        result["cases"].append(case)
        print(f"{n} stream(s) x {a.rounds}: {case['completion_tokens']} tokens in {case['wall_seconds']:.2f} s = "
              f"{case['completion_tokens_per_second']:.1f} tok/s, mean TTFT {case['mean_ttft_seconds'] * 1000:.0f} ms"
              + ("" if case["every_request_got_max_tokens"] else " (some requests got fewer than --max-tokens)"),
              file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
