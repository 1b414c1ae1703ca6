#!/usr/bin/env python3
"""Soak test: N concurrent clients against one `strata serve` for T minutes, then checks that nothing leaked.

    .venv/bin/python tools/soak.py --streams 64 --minutes 30 --out bench/results/cpu-soak-64x30.json

Starts build/strata serve (configs/smollm2-cpu.yaml, with any --set) on a free port. Each client loops over a mix
of what production traffic holds: chat and completions (some with a batch of prompts), streamed or not, prompts that
share a document (the prefix cache) or a system prompt, the KV compression policies a request may pick, clients
that hang up mid-stream, and bad requests (which must get their 4xx). Every 10 s it samples the server's RSS,
requests done and errors, and the KV blocks free. At the end it waits until the server is idle and checks
/v1/kv_state: no sequence, no cached block in use, every block free or cached.

Fails (exit 1) on any unexpected answer, an RSS growth over --max-rss-growth (from the first sample after the
warm-up to the last), or blocks not back. Writes every sample and the verdict to --out as JSON.
"""
import argparse
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_support import free_port, machine, wait_healthy  # noqa: E402

POLICIES = [None, None, {"policy": "snapkv", "budget": 64}, {"policy": "pyramidkv", "budget": 96},
            {"policy": "streaming", "budget": 64}, {"policy": "h2o", "budget": 64}, {"policy": "simlayerkv"}]
QUESTIONS = ["What is this about?", "Who is mentioned first?", "Summarise it in one line.", "What comes next?"]
BAD_BODIES = [{"prompt": 42}, {"prompt": "hi", "temperature": "hot"}, {"prompt": "hi", "tools": []},
              {"prompt": "hi", "logit_bias": {"abc": 1}}, {"prompt": "hi", "kv_compression": {"policy": "nosuch"}}]


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.done = 0
        self.hung_up = 0
        self.refused = 0   # bad requests answered 4xx, as they must be
        self.errors = []   # unexpected answers: (what, detail)

    def add(self, field, detail=None):
        with self.lock:
            if field == "errors":
                self.errors.append(detail)
            else:
                setattr(self, field, getattr(self, field) + 1)


def documents():
    texts = sorted((ROOT / "tests" / "fixtures" / "texts").glob("*.txt"))
    return [t.read_text(encoding="utf-8")[:1200] for t in texts]


def one_request(base_url, rng, docs, tally):
    roll = rng.random()
    if roll < 0.05:
        response = requests.post(f"{base_url}/v1/completions", json=rng.choice(BAD_BODIES), timeout=60)
        tally.add("refused" if response.status_code == 400 else "errors", ("bad request", response.status_code))
        return
    chat = roll < 0.5
    body = {"max_tokens": rng.randint(8, 96), "temperature": rng.choice([0, 0.8]), "stream": rng.random() < 0.6}
    policy = rng.choice(POLICIES)
    if policy:
        body["kv_compression"] = policy
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(QUESTIONS) + f" ({rng.randint(0, 999)})"}]
    else:
        # A fifth of the completions are batches of prompts (one engine request each, answered as one).
        prompts = [rng.choice(docs) + "\nQuestion: " + rng.choice(QUESTIONS) + "\nAnswer:"
                   for _ in range(rng.randint(2, 4) if rng.random() < 0.2 else 1)]
        body["prompt"] = prompts if len(prompts) > 1 else prompts[0]
    url = f"{base_url}/v1/{'chat/completions' if chat else 'completions'}"
    hang_up = body["stream"] and rng.random() < 0.1
    with requests.post(url, json=body, timeout=600, stream=body["stream"]) as response:
        if response.status_code != 200:
            tally.add("errors", (url, response.status_code, response.text[:300]))
            return
        if not body["stream"]:
            choices = response.json()["choices"]
            expected = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
            if sorted(c["index"] for c in choices) != list(range(expected)):
                tally.add("errors", (url, "choices", [c["index"] for c in choices], expected))
                return
        else:
            for n, line in enumerate(response.iter_lines()):
                if line.startswith(b"data: {\"error\""):
                    tally.add("errors", (url, "error event", line[:300].decode(errors="replace")))
                    return
                if hang_up and n >= 3:
                    tally.add("hung_up")
                    return  # the connection closes mid-stream
    tally.add("done")


def client(base_url, seed, deadline, docs, tally):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        try:
            one_request(base_url, rng, docs, tally)
        except requests.RequestException as e:
            tally.add("errors", ("exception", repr(e)[:300]))


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def gauge(base_url, name):
    for line in requests.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def final_state(base_url, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while True:
        state = requests.get(f"{base_url}/v1/kv_state", timeout=60).json()
        if not state["sequences"] or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--warmup-minutes", type=float, default=2, help="RSS growth is measured from here on")
    ap.add_argument("--max-rss-growth", type=float, default=0.05)
    ap.add_argument("--binary", default=str(ROOT / "build" / "strata"))
    ap.add_argument("--set", action="append", default=[], help="section.key=value for strata serve")
    ap.add_argument("--out", help="JSON file for the samples and the verdict")
    args = ap.parse_args()

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [args.binary, "serve", "--config", str(ROOT / "configs" / "smollm2-cpu.yaml"), "--port", str(port),
               "--set", f"engine.max_running={args.streams}"]
    for s in args.set:
        command += ["--set", s]
    server = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(server, port, 120)
        result = soak(args, server, base_url)
    finally:
        server.terminate()
        server.wait(timeout=60)
    result.update({"command": " ".join(sys.argv), "server_command": " ".join(command), "machine": machine(),
                   "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                            text=True).stdout.strip()})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    return 0 if result["passed"] else 1


def soak(args, server, base_url):
    tally = Tally()
    docs = documents()
    started = time.monotonic()
    deadline = started + args.minutes * 60
    threads = [threading.Thread(target=client, args=(base_url, i, deadline, docs, tally), daemon=True)
               for i in range(args.streams)]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        time.sleep(10)
        samples.append({"t_s": round(time.monotonic() - started, 1), "rss_bytes": rss_bytes(server.pid),
                        "done": tally.done, "errors": len(tally.errors),
                        "kv_blocks_free": gauge(base_url, "strata_kv_blocks_free")})
    for t in threads:
        t.join()
    state = final_state(base_url)
    after_warmup = [s for s in samples if s["t_s"] >= args.warmup_minutes * 60] or samples
    growth = (samples[-1]["rss_bytes"] - after_warmup[0]["rss_bytes"]) / after_warmup[0]["rss_bytes"]
    blocks_back = (not state["sequences"] and state["prefix_blocks_in_use"] == 0 and
                   state["blocks_free"] + state["blocks_cached"] == state["blocks_total"])
    return {"streams": args.streams, "minutes": args.minutes, "requests_done": tally.done,
            "hung_up": tally.hung_up, "bad_requests_refused": tally.refused, "errors": len(tally.errors),
            "first_errors": tally.errors[:10], "rss_growth_after_warmup": round(growth, 4),
            "blocks_total": state["blocks_total"], "blocks_free": state["blocks_free"],
            "blocks_cached": state["blocks_cached"], "blocks_back": blocks_back,
            "passed": not tally.errors and growth <= args.max_rss_growth and blocks_back, "samples": samples}


if __name__ == "__main__":
    sys.exit(main())
