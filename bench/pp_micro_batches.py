#!/usr/bin/env python3
"""Decode throughput of a pipeline-parallel `strata serve` world with and without micro-batching
(parallel.micro_batches, docs/distributed.md): for each value, starts the world under mpirun, sends BATCH concurrent
streaming greedy completions of GEN tokens (ignore_eos), and measures decode tokens/s over the window in which every
stream is decoding (from the last stream's first token to the first stream's last token), so prefill is left out.

    .venv/bin/python bench/pp_micro_batches.py --pp 2 --micro-batches 1,2 --batch 8 --gen 64 \
        --out bench/results/cpu-pp2-micro-batches.json

Every rank runs with engine.threads=1 (OMP_NUM_THREADS=1): on a 2-core machine PP=2 then has one core per stage.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from bench_support import free_port, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def start_world(binary, config, pp, micro_batches, batch, port, log):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = [shutil.which("mpirun"), "--oversubscribe", "-np", str(pp), str(binary), "serve", "--config", str(config),
           "--port", str(port), "--pp", str(pp), "--set", "engine.threads=1", "--set", "kv_cache.memory_mib=256",
           "--set", f"parallel.micro_batches={micro_batches}", "--set", f"engine.max_running={max(16, batch)}"]
    process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_healthy(process, port, 180)
    return cmd, process


def stream(base_url, n_tokens, times):
    body = {"model": "SmolLM2-135M-Instruct", "prompt": PROMPT, "max_tokens": n_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                times.append(time.perf_counter())


def measure(base_url, batch, n_tokens):
    streams = [[] for _ in range(batch)]
    threads = [threading.Thread(target=stream, args=(base_url, n_tokens, t)) for t in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    begin = max(t[0] for t in streams)
    end = min(t[-1] for t in streams)
    n = sum(sum(1 for x in t if begin < x <= end) for t in streams)
    return {"decode_tokens": n, "window_s": end - begin, "decode_tokens_per_s": n / (end - begin),
            "tokens_per_stream": [len(t) for t in streams]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(ROOT / "build" / "strata"))
    parser.add_argument("--config", default=str(ROOT / "configs" / "smollm2-cpu.yaml"))
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--micro-batches", default="1,2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    record = {"command": " ".join([sys.executable, *sys.argv]), "machine": {
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
        "cores": os.cpu_count(), "kernel": platform.release()},
        "loadavg_before": open("/proc/loadavg").read().split()[:3], "pp": args.pp, "batch": args.batch,
        "gen_tokens": args.gen, "runs": []}
    for m in [int(x) for x in args.micro_batches.split(",")]:
        port = free_port()
        log_path = Path(tempfile.mkdtemp(prefix="strata-pp-bench-")) / "serve.log"
        with open(log_path, "wb") as log:
            cmd, process = start_world(args.binary, args.config, args.pp, m, args.batch, port, log)
            try:
                base_url = f"http://127.0.0.1:{port}"
                measure(base_url, args.batch, 8)  # warm-up
                runs = [measure(base_url, args.batch, args.gen) for _ in range(args.repeats)]
            finally:
                process.terminate()
                process.wait(timeout=60)
        best = max(r["decode_tokens_per_s"] for r in runs)
        record["runs"].append({"micro_batches": m, "world_command": " ".join(cmd), "repeats": runs,
                               "best_decode_tokens_per_s": best})
        each = ", ".join("%.1f" % r["decode_tokens_per_s"] for r in runs)
        print(f"micro_batches={m}: decode {best:.1f} tokens/s (best of {args.repeats}: {each})", flush=True)
    record["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
