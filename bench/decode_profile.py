#!/usr/bin/env python3
"""Where a CPU decode step's time goes: `perf record` on `strata bench`, its decode's samples grouped by what the
functions do (the weight products, attention, the compute pool's waits, the rest), so that the weight bytes a
step reads can be set against the time the weight products take ([cpu-xeon]: the share of the read bandwidth).

  .venv/bin/python bench/decode_profile.py [--set engine.activation_dtype=int8] [--prompt-tokens 16]
      [--gen-tokens 320] [--read-gbs 33.0] [--binary build-before-COMMIT/build/strata] [--out bench/results/FILE.json]

Needs `perf` (Debian package linux-perf). --read-gbs (build/bench/read_bandwidth's figure) adds the rate at which
the weight products stream the weights while they run, as a share of it: weight bytes per step / (their share of
the samples x seconds per step): an upper bound, since a thread that has finished its share of a product waits in
the pool while the product's wall time goes on. The groups are also given for each thread (the main one first), as
shares of that thread's samples. --binary profiles another build (bench/build_commit.sh makes one per commit). Run
it on an idle machine.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import BINARY, ROOT, commit, machine  # noqa: E402

# Which group a symbol belongs to, by the first pattern it matches.
GROUPS = [
    ("weight products", r"rows16_tiles|vnni_rows|vnni_tile|amx_tiles|activation_tile|block_products|int8_rows|pair_row|"
                        r"q4_k_row|q6_k_row|quantized_dot|sgemm|"
                        r"weight_row|portable_dot"),
    ("attention", r"row_scores|rows_values|chunk_scores|softmax|exp_shifted|paged_attention|tile_scores|block_scores|"
                  r"sum_values|span_partials|combine_spans"),
    ("read-ahead", r"ThreadPool::read_ahead"),
    ("compute pool waits", r"ThreadPool::(worker_loop|run|work_on)|sched_yield|futex|__schedule"),
    ("activation rounding", r"round_row|round_activations|round_to_integers"),
]


def grouped(shares: dict[str, float]) -> dict[str, float]:
    out = {name: 0.0 for name, _ in GROUPS} | {"other": 0.0}
    for symbol, share in shares.items():
        group = next((name for name, pattern in GROUPS if re.search(pattern, symbol)), "other")
        out[group] += share
    return {k: round(v, 2) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/smollm2-cpu.yaml")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=320)
    ap.add_argument("--read-gbs", type=float, default=None)
    ap.add_argument("--binary", default=str(BINARY))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    bench = [a.binary, "bench", "--config", a.config, "--batch", "1", "--prompt-tokens", str(a.prompt_tokens),
             "--gen-tokens", str(a.gen_tokens), *[x for s in a.sets for x in ("--set", s)]]
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "bench.json"
        data = Path(tmp) / "perf.data"
        record = ["perf", "record", "-o", str(data), *bench, "--out", str(result)]
        subprocess.run(record, cwd=ROOT, check=True, capture_output=True)
        run = json.loads(result.read_text())["results"][0]
        # Only the decode's samples: the bench's decode time back from the last weight product's sample, which
        # ends the last step. Start-up (the KV pool's pages faulted in, seconds on a VM's first touch) and the exit
        # (the pool unmapped) stay out, however long they take.
        products = re.compile(dict(GROUPS)["weight products"])
        samples = subprocess.run(["perf", "script", "-i", str(data), "-F", "time,ip,sym"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout.splitlines()
        end = max(float(line.split(":")[0]) for line in samples if products.search(line))
        window = f"{end - run['decode_seconds']:.6f},{end:.6f}"
        report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "pid,symbol",
                                 "--stdio", "--time", window], cwd=ROOT, check=True, capture_output=True,
                                text=True).stdout
    shares, by_thread = {}, {}
    for line in report.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(\d+):\S+\s+\[[.k]\]\s+(.*?)(\s{2,}|$)", line)
        if m:
            share, thread, symbol = float(m.group(1)), int(m.group(2)), m.group(3)
            shares[symbol] = shares.get(symbol, 0.0) + share
            by_thread.setdefault(thread, {})
            by_thread[thread][symbol] = by_thread[thread].get(symbol, 0.0) + share
    groups = grouped(shares)
    # Each thread's groups as shares of its own samples; the lowest id is the process's own (main) thread.
    threads = {f"thread {i}" + (" (main)" if i == 0 else ""): grouped(
        {k: 100 * v / sum(by_thread[t].values()) for k, v in by_thread[t].items()})
        for i, t in enumerate(sorted(by_thread)) if sum(by_thread[t].values()) >= 1.0}
    version = subprocess.run([a.binary, "--version"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    out = {"what": "perf samples of strata bench's batch-1 decode, grouped (bench/decode_profile.py)",
           "command": " ".join(sys.argv), "perf_command": " ".join(record[:2]) + " -o FILE strata bench ...",
           "bench_command": " ".join(bench), "commit": commit(), "binary_version": version.splitlines()[0],
           "machine": machine(),
           "decode_tokens_per_second": run["decode_tokens_per_second"],
           "weight_bytes_per_step": run["bandwidth"]["weight_bytes_per_step"], "groups_percent": groups,
           "groups_percent_of_each_thread": threads,
           "top_symbols_percent": dict(sorted(shares.items(), key=lambda kv: -kv[1])[:20])}
    if a.read_gbs:
        # Every thread works on the same product at a time, so the products' share of the samples is their share
        # of a step's wall time too, less the waits of a thread done with its share (an upper bound).
        busy = groups["weight products"] / 100 / run["decode_tokens_per_second"]
        out["read_gb_per_s"] = a.read_gbs
        out["weight_products_stream_share_of_read_bandwidth"] = round(
            run["bandwidth"]["weight_bytes_per_step"] / busy / 1e9 / a.read_gbs, 3)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("decode_tokens_per_second", "groups_percent",
                                          "groups_percent_of_each_thread")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
