#!/usr/bin/env python3
"""Sends the retrieval task's prompts (eval/retrieval_task.h) to a running `strata serve` and scores the answers as
score_retrieval does; the probe of docs/eval/retrieval-design.md.

The prompts come from the C++ code itself, as token ids (one JSON line per case), written by
    build/strata eval --config configs/smollm2-cpu.yaml --dump-retrieval-prompts /tmp/prompts.jsonl \\
        --retrieval-lengths 2000,4000,8000 --retrieval-trials 6
then, with a server on PORT:
    .venv/bin/python tools/retrieval_probe.py /tmp/prompts.jsonl --port PORT --out results.json
Greedy (temperature 0), /v1/completions, the prompt sent as token ids; the depths of one trial, which share their
filler, go deepest first so that the server's prefix cache saves part of the prefill. The output is rewritten after every case,
so a run that is stopped keeps what it measured; --skip-done continues such a run.
"""
import argparse
import json
import time
import urllib.request
from collections import OrderedDict


def correct(answer, expected):
    a = answer.lstrip()
    return a.startswith(expected) and not a[len(expected):len(expected) + 1].isdigit()


def summary(cases):
    table = OrderedDict()
    for c in cases:
        key = f"{c['length']}@{c['depth']:g}"
        cell = table.setdefault(key, {"length": c["length"], "depth": c["depth"], "correct": 0, "total": 0})
        cell["correct"] += int(c["correct"])
        cell["total"] += 1
    return list(table.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prompts")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="", help="only these lengths (comma-separated)")
    ap.add_argument("--depths", default="", help="only these depths (comma-separated)")
    ap.add_argument("--trials", type=int, default=0, help="only the first N trials of each cell (0: all)")
    ap.add_argument("--skip-done", action="store_true", help="keep the cases already in --out, run the others")
    ap.add_argument("--note", default="", help="recorded in the output (the server command, the machine)")
    args = ap.parse_args()
    lengths = {int(x) for x in args.lengths.split(",") if x}
    depths = {float(x) for x in args.depths.split(",") if x}

    cases, done = [], set()
    if args.skip_done:
        try:
            cases = json.load(open(args.out))["cases"]
            done = {(c["length"], c["depth"], c["trial"]) for c in cases}
        except FileNotFoundError:
            pass
    # A trial's depths share their filler: deepest first, each later prompt reuses the prefix the server cached.
    prompts = sorted((json.loads(line) for line in open(args.prompts)),
                     key=lambda p: (p["length"], p["trial"], -p["depth"]))
    for p in prompts:
        if (lengths and p["length"] not in lengths) or (depths and p["depth"] not in depths):
            continue
        if (args.trials and p["trial"] >= args.trials) or (p["length"], p["depth"], p["trial"]) in done:
            continue
        body = json.dumps({"prompt": p["prompt"], "max_tokens": p["generate"], "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        start = time.time()
        response = json.load(urllib.request.urlopen(request, timeout=1800))
        answer = response["choices"][0]["text"]
        cases.append({"length": p["length"], "depth": p["depth"], "trial": p["trial"],
                      "prompt_tokens": response["usage"]["prompt_tokens"], "expected": p["expected"],
                      "answer": answer, "correct": correct(answer, p["expected"]),
                      "seconds": round(time.time() - start, 1)})
        print(json.dumps(cases[-1]), flush=True)
        with open(args.out, "w") as f:
            json.dump({"note": args.note, "summary": summary(cases), "cases": cases}, f, indent=1)
            f.write("\n")
    for cell in summary(cases):
        print(f"{cell['length']:>5} depth {cell['depth']:<5g} {cell['correct']}/{cell['total']}")


if __name__ == "__main__":
    main()
