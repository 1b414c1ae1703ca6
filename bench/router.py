#!/usr/bin/env python3
"""strata route over replicas on this machine: cache-aware routing against round-robin and against one replica
alone, the router's own cost, and a replica killed mid-workload.

  .venv/bin/python bench/router.py [--replicas 3] [--documents 8] [--questions 8] [--doc-tokens 1500]
                                   [--concurrency 3] [--replica-mib 256] [--out bench/results/router-cpu.json]

The workload: --documents documents of --doc-tokens tokens (windows of the committed test texts), each asked
--questions questions, arriving interleaved (round j asks every document its question j, the documents in a seeded
order), --concurrency requests at a time, each streamed with a few greedy tokens. It runs three times on fresh
replicas (SmolLM2, engine.threads=1): over --replicas replicas of --replica-mib MiB of KV pool each behind
`strata route`, cache-aware then round-robin, and on one replica alone with the pools of all of them together (the
same memory). For each it records every request's time to first token and the share of prompt tokens the replicas'
prefix caches served (their strata_prefix_cache_hits_total over strata_prefix_cache_queries_total). Then, on the
cache-aware fleet: the time to first token of the same requests to one replica directly and through a router of
that replica alone, alternating (the router's cost); and a replica killed with SIGKILL during a run of questions:
which requests failed before their stream began, how long until the router's /health showed it out, and how long
after its restart until it was back. Raw results, the machine, the commands and the commit go to --out.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import requests

from bench_support import free_port, machine, start_serve

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "strata"
CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
MODEL_FILE = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "SmolLM2-135M-Instruct"
TEXTS = ["the_keepers_ledger.txt", "a_coastal_almanac.txt", "how_clocks_keep_time.txt", "the_winter_clock.txt"]
QUESTIONS = ["Who is the text about?", "What happens first?", "Where does it take place?", "What is counted?",
             "Which season is named?", "What changes at the end?", "Who keeps the record?", "What is repaired?"]
MAX_TOKENS = 4


def tokenize(text: str | list[int], decode: bool = False):
    args = [str(BINARY), "tokenize", "--model", str(MODEL_FILE)] + (["--decode"] if decode else [])
    done = subprocess.run(args, input=json.dumps(text), capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def documents(n: int, n_tokens: int) -> list[str]:
    """n texts of about n_tokens tokens each: windows of the test texts, decoded back to text."""
    ids = [t for name in TEXTS for t in tokenize((ROOT / "tests/fixtures/texts" / name).read_text(encoding="utf-8"))]
    if len(ids) < n * n_tokens:
        raise SystemExit(f"the test texts hold {len(ids)} tokens, fewer than {n} x {n_tokens}")
    return [f"Document {i}:\n" + tokenize(ids[i * n_tokens:(i + 1) * n_tokens], decode=True) for i in range(n)]


def workload(docs: list[str], n_questions: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    requests_ = []
    for j in range(n_questions):
        order = list(range(len(docs)))
        rng.shuffle(order)
        for d in order:
            requests_.append({"document": d, "question": j,
                              "prompt": f"{docs[d]}\n\nQuestion: {QUESTIONS[j % len(QUESTIONS)]}\nAnswer:"})
    return requests_


class Process:
    """A strata serve or strata route of the benchmark's, its output discarded."""

    def __init__(self, args: list[str], port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(BINARY), *args[:1], "--config", str(CONFIG), "--port", str(self.port), *args[1:]]
        self.process = start_serve(self.command, ROOT, self.port, 120)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def replica(mib: int, port: int | None = None) -> Process:
    return Process(["serve", "--set", "engine.threads=1", "--set", f"kv_cache.memory_mib={mib}",
                    "--set", "server.access_log=false"], port)


def router(replicas: list[Process], policy: str) -> Process:
    args = ["route", "--policy", policy, "--set", "router.health_interval_ms=200",
            "--set", "router.health_timeout_ms=500", "--set", "server.access_log=false"]
    for r in replicas:
        args += ["--replica", r.url]
    return Process(args)


async def one_request(client: httpx.AsyncClient, url: str, prompt: str) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    sent = time.perf_counter()
    record = {"ttft_s": None, "status": None, "error": None, "events": 0}
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
            record["status"] = response.status_code
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    record["error"] = chunk["error"]["message"]
                    break
                record["events"] += 1
                if record["ttft_s"] is None:
                    record["ttft_s"] = time.perf_counter() - sent
            if response.status_code != 200:
                record["error"] = (await response.aread()).decode(errors="replace")[:300]
    except httpx.HTTPError as e:
        record["error"] = f"{type(e).__name__}: {e}"
    record["total_s"] = time.perf_counter() - sent
    return record


async def run_requests(url: str, prompts: list[str], concurrency: int, on_done=None) -> list[dict]:
    limit = asyncio.Semaphore(concurrency)
    n_done = 0

    async def bounded(client, prompt):
        nonlocal n_done
        async with limit:
            record = await one_request(client, url, prompt)
        n_done += 1
        if on_done:
            await on_done(n_done)
        return record

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency * 2)) as client:
        return await asyncio.gather(*(bounded(client, p) for p in prompts))


def cache_counters(replicas: list[Process]) -> tuple[float, float]:
    hits = queries = 0.0
    for r in replicas:
        for line in requests.get(f"{r.url}/metrics", timeout=10).text.splitlines():
            if line.startswith("strata_prefix_cache_hits_total "):
                hits += float(line.split()[1])
            elif line.startswith("strata_prefix_cache_queries_total "):
                queries += float(line.split()[1])
    return hits, queries


def summary(records: list[dict], hits: float, queries: float, wall_s: float) -> dict:
    ttfts = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    return {"requests": len(records), "failed": sum(1 for r in records if r["error"]), "wall_s": round(wall_s, 2),
            "cached_prompt_tokens": hits, "prompt_tokens": queries, "cache_share": hits / queries if queries else 0,
            "ttft_mean_s": statistics.mean(ttfts), "ttft_median_s": statistics.median(ttfts),
            "ttft_p90_s": statistics.quantiles(ttfts, n=10)[-1] if len(ttfts) >= 10 else max(ttfts)}


def measure(url: str, replicas: list[Process], load: list[dict], concurrency: int) -> dict:
    start = time.perf_counter()
    records = asyncio.run(run_requests(url, [w["prompt"] for w in load], concurrency))
    hits, queries = cache_counters(replicas)
    result = summary(records, hits, queries, time.perf_counter() - start)
    result["records"] = [{**{k: w[k] for k in ("document", "question")}, **r} for w, r in zip(load, records)]
    return result


def fleet_run(args, load, policy: str) -> tuple[dict, list[Process], Process]:
    replicas = [replica(args.replica_mib) for _ in range(args.replicas)]
    front = router(replicas, policy)
    result = measure(front.url, replicas, load, args.concurrency)
    result["commands"] = [replicas[0].command, front.command]
    return result, replicas, front


def router_overhead(replica0: Process, docs: list[str], pairs: int) -> dict:
    """The same cached prompt to the replica directly and through a router of it alone, alternating, one at a time."""
    alone = router([replica0], "cache_aware")
    prompt = f"{docs[0]}\n\nQuestion: {QUESTIONS[0]}\nAnswer:"
    direct, routed = [], []
    try:
        asyncio.run(run_requests(replica0.url, [prompt], 1))  # cached from here on
        for _ in range(pairs):
            direct += asyncio.run(run_requests(replica0.url, [prompt], 1))
            routed += asyncio.run(run_requests(alone.url, [prompt], 1))
    finally:
        alone.stop()
    d = statistics.median(r["ttft_s"] for r in direct)
    r = statistics.median(r["ttft_s"] for r in routed)
    return {"pairs": pairs, "direct_ttft_median_s": d, "routed_ttft_median_s": r, "overhead_median_ms": (r - d) * 1e3,
            "command": alone.command}


def health_of(front: Process, url: str) -> dict:
    replicas = requests.get(f"{front.url}/health", timeout=5).json()["replicas"]
    return next(r for r in replicas if r["url"] == url)


def wait_state(front: Process, url: str, in_service: bool, bound_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < bound_s:
        if health_of(front, url)["in_service"] == in_service:
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def kill_run(args, docs, replicas: list[Process], front: Process) -> dict:
    """Questions the documents were not asked yet; after a third of them, SIGKILL one replica. back_after_restart_s
    counts from the restarted replica's first 200 on /health."""
    load = [{"prompt": f"{docs[d]}\n\nQuestion: In one word, what is document {d} about? ({k})\nAnswer:"}
            for k in range(2) for d in range(len(docs))]
    victim = replicas[1]
    observed = {}

    async def on_done(n_done):
        if n_done == len(load) // 3 and not observed:
            in_flight = health_of(front, victim.url)["in_flight"]
            victim.process.send_signal(signal.SIGKILL)
            out_s = await asyncio.to_thread(wait_state, front, victim.url, False, 10)
            observed.update(in_flight=in_flight, out_s=out_s)

    records = asyncio.run(run_requests(front.url, [w["prompt"] for w in load], args.concurrency, on_done))
    restarted = replica(args.replica_mib, port=victim.port)
    replicas[1] = restarted
    back_s = wait_state(front, victim.url, True, 10)
    not_started = [r for r in records if r["error"] and r["events"] == 0]
    cut = [r for r in records if r["error"] and r["events"] > 0]
    attempts = [line for line in requests.get(f"{front.url}/metrics", timeout=10).text.splitlines()
                if line.startswith(("strata_router_requests_total", "strata_router_retries_total"))]
    return {"requests": len(records), "failed_before_streaming": len(not_started), "cut_mid_stream": len(cut),
            "errors": [r["error"] for r in not_started + cut], "victim_in_flight_at_kill": observed.get("in_flight"),
            "out_after_kill_s": observed.get("out_s"), "back_after_restart_s": back_s,
            "router_attempts_after_the_run": attempts}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--replica-mib", type=int, default=256)
    parser.add_argument("--overhead-pairs", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "router-cpu.json"))
    args = parser.parse_args()
    docs = documents(args.documents, args.doc_tokens)
    load = workload(docs, args.questions)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result = {"machine": machine(), "commit": commit, "command": " ".join(["bench/router.py", *sys.argv[1:]]),
              "settings": vars(args), "max_tokens": MAX_TOKENS, "load_average_at_start": os.getloadavg()}

    round_robin, replicas, front = fleet_run(args, load, "round_robin")
    for p in [front, *replicas]:
        p.stop()
    alone = replica(args.replica_mib * args.replicas)
    result["one_replica"] = measure(alone.url, [alone], load, args.concurrency)
    result["one_replica"]["command"] = alone.command
    alone.stop()
    cache_aware, replicas, front = fleet_run(args, load, "cache_aware")
    result["cache_aware"], result["round_robin"] = cache_aware, round_robin
    try:
        result["router_overhead"] = router_overhead(replicas[0], docs, args.overhead_pairs)
        result["kill"] = kill_run(args, docs, replicas, front)
    finally:
        for p in [front, *replicas]:
            p.stop()
    one = result["one_replica"]["cache_share"]
    result["goals"] = {
        "cache_share_vs_one_replica": cache_aware["cache_share"] / one if one else None,
        "round_robin_share_vs_one_replica": round_robin["cache_share"] / one if one else None,
        "ttft_mean_round_robin_over_cache_aware": round_robin["ttft_mean_s"] / cache_aware["ttft_mean_s"],
        "router_overhead_median_ms": result["router_overhead"]["overhead_median_ms"],
    }
    result["load_average_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["goals"], indent=1), json.dumps(result["kill"], indent=1))


if __name__ == "__main__":
    main()
