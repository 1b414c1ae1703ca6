#!/usr/bin/env python3
"""Collects the raw outputs of bench/cpu_vs_llamacpp.sh into one JSON file and prints the comparison table.

Input: the runs file the script appends to (one JSON object per command: kind, engine, command line as run, and
the file its output went to), and the machine description. Output (--out): every command line, every raw number,
the means over repetitions and the ratios Strata / llama.cpp.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys


def git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.rstrip()
    except (OSError, subprocess.CalledProcessError):
        return None


def read_text(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def sha256(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def failure(run: dict) -> dict:
    """A command that exited with an error (the script goes on after a llama.cpp one): what ran, how it ended, and
    the end of what it wrote to stderr (a server's log)."""
    status = run["exit_status"]
    how = f"exit status {status}"
    if status > 128:  # the shell's status for a command killed by a signal
        try:
            how += f" ({signal.Signals(status - 128).name})"
        except ValueError:
            pass
    err = run["raw"] if run["format"] == "log" else run["raw"] + ".err"
    tail = read_text(err).splitlines()[-20:] if os.path.exists(err) else []
    return {"kind": run["kind"], "engine": run["engine"], "command": run["command"], "exit_status": status,
            "how": how, "stderr_tail": tail}


def weight_bytes(model: str) -> int:
    """The bytes of the GGUF's tensors: what a batch-1 decode step of SmolLM2 reads, every weight once (its output
    head is the token embedding; the embedding lookup's one row is not counted twice)."""
    import gguf  # tools/requirements.txt

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(model).tensors)


def weight_reads_of_bandwidth(model: str, bandwidth: dict | None, decode: dict) -> dict:
    """Weight bytes read per second by each engine's batch-1 decode (after the prompt), against the read
    bandwidth build/bench/read_bandwidth measured on the same threads."""
    gb_per_s = bandwidth and bandwidth.get("read_gb_per_s")
    step_bytes = weight_bytes(model)
    out = {"weight_bytes_per_step": step_bytes, "read_gb_per_s": gb_per_s,
           "what": "tok/s x the GGUF's tensor bytes / the measured read bandwidth (batch-1 decode after the prompt)"}
    for engine in ("llama.cpp", "strata"):
        rate = decode.get(engine)
        out[engine] = rate * step_bytes / 1e9 / gb_per_s if rate and gb_per_s else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--llamacpp-python-version", required=True)
    ap.add_argument("--llamacpp-src", required=True)
    ap.add_argument("--llamacpp-build", required=True)
    ap.add_argument("--cmake-flags", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--prompt-tokens", type=int, required=True)
    ap.add_argument("--gen-tokens", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--http-rounds", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--strata-sets", default="")
    ap.add_argument("--script-command", required=True)
    ap.add_argument("--started", required=True)
    a = ap.parse_args()

    with open(a.runs) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    with open(a.machine) as f:
        machine = json.load(f)
    machine["load_average_at_end"] = list(os.getloadavg())

    raw: dict[str, list] = {"llama_bench": [], "llama_bench_depth": [], "llama_batched_bench": [],
                            "strata_bench_batch1": [], "strata_bench_batched": [], "llama_server_http": None,
                            "strata_serve_http": None}
    commands, failures = [], []
    for run in runs:
        kind, engine, fmt = run["kind"], run["engine"], run["format"]
        commands.append({k: run[k] for k in ("kind", "engine", "command", "seconds", "load_average_1min_before",
                                             "exit_status") if k in run})
        if "exit_status" in run:
            failures.append(failure(run))
            continue
        if fmt == "log":  # a server's log: keep the lines that say how it runs
            keep = ("CPU_REPACK", "n_ctx", "n_slots", "kv_unified", "n_threads", "threads", "KV pool", "weight")
            lines = [l.rstrip() for l in read_text(run["raw"]).splitlines() if any(k in l for k in keep)]
            raw.setdefault("server_log_excerpts", {})[engine] = lines[:60]
            continue
        if fmt == "llama-load-probe":  # llama-bench -v on a tiny prompt: how llama.cpp loads the model
            keep = ("- type ", "CPU_REPACK", "file type", "buffer size", "flash_attn", "model type")
            raw["llama_load_probe"] = [l.rstrip() for l in read_text(run["raw"] + ".err").splitlines()
                                       if any(k in l for k in keep) and "input tensor" not in l][:40]
            continue
        if fmt == "llama-bench-json":
            data = json.loads(read_text(run["raw"]))
            raw["llama_bench_depth" if kind == "batch1-depth" else "llama_bench"].extend(data)
        elif fmt == "llama-batched-bench-jsonl":
            rows = [r for r in json_lines(read_text(run["raw"]) + "\n" + read_text(run["raw"] + ".err"))
                    if "speed_tg" in r]
            if not rows:
                raise SystemExit(f"cpu_vs_llamacpp_report: no result line in the output of {run['command']}")
            raw["llama_batched_bench"].extend(rows)
        elif fmt.startswith("strata-bench-json:"):
            with open(fmt.split(":", 1)[1]) as f:
                data = json.load(f)
            raw["strata_bench_batch1" if kind == "batch1" else "strata_bench_batched"].append(data)
        elif fmt.startswith("read-bandwidth-json:"):
            with open(fmt.split(":", 1)[1]) as f:
                raw["read_bandwidth"] = json.load(f)
        elif fmt.startswith("http-load-json:"):
            with open(fmt.split(":", 1)[1]) as f:
                data = json.load(f)
            raw["llama_server_http" if engine == "llama-server" else "strata_serve_http"] = data

    P, G, B = a.prompt_tokens, a.gen_tokens, a.batch

    def lb_test(rows, n_prompt, n_gen, depth=0):
        for r in rows:
            if r.get("n_prompt") == n_prompt and r.get("n_gen") == n_gen and r.get("n_depth", 0) == depth:
                return r
        return None

    pp = lb_test(raw["llama_bench"], P, 0)
    tg = lb_test(raw["llama_bench"], 0, G)
    tg_depth = lb_test(raw["llama_bench_depth"], 0, G, P)

    def strata_rates(files, batch):
        pre, dec = [], []
        for d in files:
            for r in d.get("results", []):
                if r.get("batch") == batch:
                    pre.append(r.get("prefill_tokens_per_second"))
                    dec.append(r.get("decode_tokens_per_second"))
        return pre, dec

    s1_pre, s1_dec = strata_rates(raw["strata_bench_batch1"], 1)
    sb_pre, sb_dec = strata_rates(raw["strata_bench_batched"], B)
    bb = [r for r in raw["llama_batched_bench"] if r.get("pl") == B]

    def http_case(data, streams):
        for c in (data or {}).get("cases", []):
            if c["streams"] == streams:
                return c
        return None

    lh1, lhb = http_case(raw["llama_server_http"], 1), http_case(raw["llama_server_http"], B)
    sh1, shb = http_case(raw["strata_serve_http"], 1), http_case(raw["strata_serve_http"], B)

    def tps(c):
        return c["completion_tokens_per_second"] if c else None

    def ttft(c):
        return c["mean_ttft_seconds"] if c else None

    summary = {
        "prefill_tokens_per_second": {
            "llama.cpp": pp and pp["avg_ts"], "llama.cpp_samples": pp and pp.get("samples_ts"),
            "strata": mean(s1_pre), "strata_samples": s1_pre,
            "what": f"batch 1, {P}-token prompt: llama-bench pp{P} against strata bench --batch 1 prefill"},
        "batch1_decode_tokens_per_second": {
            "llama.cpp": tg and tg["avg_ts"], "llama.cpp_samples": tg and tg.get("samples_ts"),
            "strata": mean(s1_dec), "strata_samples": s1_dec,
            "what": f"llama-bench tg{G} (from an empty cache) against strata bench --batch 1 decode (after {P} "
                    f"prompt tokens)"},
        "batch1_decode_after_prompt_tokens_per_second": {
            "llama.cpp": tg_depth and tg_depth["avg_ts"], "llama.cpp_samples": tg_depth and tg_depth.get("samples_ts"),
            "strata": mean(s1_dec), "strata_samples": s1_dec,
            "what": f"llama-bench tg{G} @ d{P} (after {P} tokens of context, as Strata) against strata bench "
                    f"--batch 1 decode"},
        f"batch{B}_decode_tokens_per_second": {
            "llama.cpp": mean(r["speed_tg"] for r in bb), "llama.cpp_samples": [r["speed_tg"] for r in bb],
            "strata": mean(sb_dec), "strata_samples": sb_dec,
            "what": f"llama-batched-bench S_TG at npl {B} against strata bench --batch {B} decode"},
        f"batch{B}_prefill_tokens_per_second": {
            "llama.cpp": mean(r["speed_pp"] for r in bb), "llama.cpp_samples": [r["speed_pp"] for r in bb],
            "strata": mean(sb_pre), "strata_samples": sb_pre,
            "what": f"llama-batched-bench S_PP at npl {B} against strata bench --batch {B} prefill"},
        "http_1_stream_tokens_per_second": {
            "llama.cpp": tps(lh1), "strata": tps(sh1),
            "what": "streaming /v1/completions, 1 stream: completion tokens / wall time"},
        f"http_{B}_streams_tokens_per_second": {
            "llama.cpp": tps(lhb), "strata": tps(shb),
            "what": f"streaming /v1/completions, {B} concurrent streams: completion tokens / wall time"},
        "http_1_stream_mean_ttft_seconds": {"llama.cpp": ttft(lh1), "strata": ttft(sh1),
                                            "what": "mean time to first token (lower is better)"},
        f"http_{B}_streams_mean_ttft_seconds": {"llama.cpp": ttft(lhb), "strata": ttft(shb),
                                                "what": "mean time to first token (lower is better)"},
    }
    for v in summary.values():
        if "strata" in v:
            v["ratio_strata_over_llamacpp"] = ratio(v["strata"], v["llama.cpp"])
    summary["batch1_decode_weight_reads_of_bandwidth"] = weight_reads_of_bandwidth(
        a.model, raw.get("read_bandwidth"), summary["batch1_decode_after_prompt_tokens_per_second"])

    ratios = {
        "batch1_decode": summary["batch1_decode_tokens_per_second"]["ratio_strata_over_llamacpp"],
        f"batch{B}_decode": summary[f"batch{B}_decode_tokens_per_second"]["ratio_strata_over_llamacpp"],
        f"prefill_{P}": summary["prefill_tokens_per_second"]["ratio_strata_over_llamacpp"],
        f"http_{B}_streams": summary[f"http_{B}_streams_tokens_per_second"]["ratio_strata_over_llamacpp"],
        "http_1_stream": summary["http_1_stream_tokens_per_second"]["ratio_strata_over_llamacpp"],
        # the like-for-like batch-1 decode: llama.cpp also decodes after the prompt's tokens of context
        "batch1_decode_after_prompt":
            summary["batch1_decode_after_prompt_tokens_per_second"]["ratio_strata_over_llamacpp"],
    }

    # The same prompts went to both servers in the same order: how often did greedy decoding agree?
    same = total = 0
    for lc, sc in ((lh1, sh1), (lhb, shb)):
        if lc and sc:
            for lr, sr in zip(lc["per_request"], sc["per_request"]):
                total += 1
                same += lr.get("text") == sr.get("text")
    summary["http_greedy_text_agreement"] = {
        "identical_completions": same, "requests": total,
        "what": "requests (same prompt ids, temperature 0) whose completion text was identical on both servers"}

    notes = []
    repack = [l for l in raw.get("llama_load_probe", []) if "CPU_REPACK" in l]
    if repack:
        notes.append("llama.cpp did not repack some weights for its faster CPU kernels (its log: "
                     + repack[0].split(": ", 1)[-1] + "); the GGUF's quantization type decides that")

    warnings = [f"{f['engine']} {f['kind']} failed ({f['how']}): {f['command']}" for f in failures]
    if failures:
        warnings.append("what the failed commands measure has no ratio")
    if machine["load_average_at_start"][0] > 0.5:
        warnings.append(f"the machine was not idle (1-minute load average {machine['load_average_at_start'][0]:.2f} "
                        "at start): llama.cpp's spinning thread pool slows down far more than Strata when another "
                        "process takes a core, so these ratios are not meaningful")
    for name, data in (("llama-server", raw["llama_server_http"]), ("strata serve", raw["strata_serve_http"])):
        for c in (data or {}).get("cases", []):
            if not c.get("every_request_got_max_tokens"):
                warnings.append(f"{name}: some requests of the {c['streams']}-stream case got fewer than {G} tokens")
            if any(r.get("tokens_from") != "usage" for r in c["per_request"]):
                warnings.append(f"{name}: no usage block in some streams; tokens counted from the chunks")
            if any(r["usage"] and r["usage"].get("prompt_tokens") != P for r in c["per_request"]):
                warnings.append(f"{name}: usage.prompt_tokens differs from {P} in some requests")
    for v in summary.values():
        if "strata" in v and (v["strata"] is None or v["llama.cpp"] is None):
            warnings.append(f"missing number: {v['what']}")

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    lcp_build = (raw["llama_bench"] or [{}])[0]
    result = {
        "what": "Strata against llama.cpp on the CPU, same GGUF, same thread count (bench/cpu_vs_llamacpp.sh)",
        "script_command": a.script_command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "started": a.started,
        "machine": machine,
        "strata": {
            "git_commit": commit,
            "git_dirty_tracked_files": dirty.splitlines() if dirty else [],
            "binary": a.strata,
            "binary_sha256": sha256(a.strata),
            "binary_mtime": datetime.datetime.fromtimestamp(os.path.getmtime(a.strata), datetime.timezone.utc)
                            .isoformat(timespec="seconds") if os.path.exists(a.strata) else None,
            "extra_sets": [x for x in a.strata_sets.split() if x != "--set"],
            # as strata bench records it (binaries before model.weight_dtype existed: fp32 dequantized from the GGUF)
            "weight_dtype": next((d.get("weight_dtype") or d.get("model", {}).get("weight_dtype")
                                  for d in raw["strata_bench_batch1"]), None),
            "machine_as_strata_records_it": (raw["strata_bench_batch1"] or [{}])[0].get("machine"),
        },
        "llama.cpp": {
            "llama_cpp_python_version": a.llamacpp_python_version,
            "source": f"PyPI sdist llama-cpp-python=={a.llamacpp_python_version}, vendor/llama.cpp",
            "build_commit": lcp_build.get("build_commit"),
            "build_number": lcp_build.get("build_number"),
            "cpu_info_as_llama_bench_reports_it": lcp_build.get("cpu_info"),
            "backends": lcp_build.get("backends"),
            "cmake_flags": a.cmake_flags.split(),
            "src": a.llamacpp_src,
            "build_dir": a.llamacpp_build,
        },
        "settings": {"model": a.model, "model_sha256": sha256(a.model), "threads": a.threads, "reps": a.reps,
                     "prompt_tokens": P, "gen_tokens": G, "batch": B, "http_rounds_per_stream": a.http_rounds},
        "ratios_strata_over_llamacpp": ratios,
        "summary": summary,
        "notes": notes,
        "warnings": warnings,
        "failures": failures,
        "commands": commands,
        "raw": raw,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    def fmt(x, unit=""):
        if x is None:
            return "-"
        return f"{x * 1000:.0f} ms" if unit == "ms" else f"{x:.1f}"

    rows = [
        (f"prefill {P} tok, batch 1 (tok/s)", "prefill_tokens_per_second", ""),
        (f"decode batch 1 (tok/s)", "batch1_decode_tokens_per_second", ""),
        (f"decode batch 1 after {P} tok (tok/s)", "batch1_decode_after_prompt_tokens_per_second", ""),
        (f"decode batch {B} (tok/s)", f"batch{B}_decode_tokens_per_second", ""),
        (f"prefill {P} tok, batch {B} (tok/s)", f"batch{B}_prefill_tokens_per_second", ""),
        ("HTTP 1 stream (tok/s)", "http_1_stream_tokens_per_second", ""),
        (f"HTTP {B} streams (tok/s)", f"http_{B}_streams_tokens_per_second", ""),
        ("HTTP 1 stream mean TTFT", "http_1_stream_mean_ttft_seconds", "ms"),
        (f"HTTP {B} streams mean TTFT", f"http_{B}_streams_mean_ttft_seconds", "ms"),
    ]
    print(f"\nStrata vs llama.cpp (llama-cpp-python {a.llamacpp_python_version}, llama.cpp "
          f"{lcp_build.get('build_commit')}, {'GGML_NATIVE=ON' if 'GGML_NATIVE=ON' in a.cmake_flags else 'AVX2'}), "
          f"{machine.get('cpu')}, {a.threads} threads, "
          f"{a.reps} rep(s); 1-min load average {machine['load_average_at_start'][0]:.2f} at start, "
          f"{machine['load_average_at_end'][0]:.2f} at end")
    print(f"{'case':<36} {'llama.cpp':>12} {'Strata':>12} {'Strata/llama.cpp':>17}")
    for label, key, unit in rows:
        v = summary[key]
        r = v["ratio_strata_over_llamacpp"]
        print(f"{label:<36} {fmt(v['llama.cpp'], unit):>12} {fmt(v['strata'], unit):>12} "
              f"{'-' if r is None else f'{r:.2f}x':>17}")
    reads = summary["batch1_decode_weight_reads_of_bandwidth"]
    print(f"{'batch-1 weight reads / bandwidth':<36} {fmt(reads['llama.cpp'] and 100 * reads['llama.cpp']):>11}% "
          f"{fmt(reads['strata'] and 100 * reads['strata']):>11}%   (read bandwidth {fmt(reads['read_gb_per_s'])} GB/s)")
    agree = summary["http_greedy_text_agreement"]
    print(f"HTTP greedy completions identical on both servers: {agree['identical_completions']} of {agree['requests']}")
    for w in warnings:
        print(f"warning: {w}")
    print(f"raw results: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
