#!/usr/bin/env python3
"""The figures the README quotes, computed again from the result files they come from.

  .venv/bin/python tools/check_figures.py     # prints each claim; exit status 1 if one is not in its document

Each claim is a document, a result file and a function that writes, from the file's numbers, the exact text the
document must contain (line breaks and runs of spaces count as one space). A figure edited in the document without
its file, or a file measured again without the document, fails the check (tests/e2e/test_figures.py runs it in the
test suite). Add a claim where a document quotes a new figure.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@dataclass
class Claim:
    document: str
    source: str  # a file under bench/results/ (or a path from there)
    text: Callable[[dict], str]


def ratios(d: dict) -> dict:
    return d["ratios_strata_over_llamacpp"]


def batch1_span(d: dict) -> str:
    """Batch-1 decode against llama.cpp from an empty cache and after the prompt, low-high."""
    lo, hi = sorted((ratios(d)["batch1_decode"], ratios(d)["batch1_decode_after_prompt"]))
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def gpu_tests_passed(d: dict, smollm2: dict) -> str:
    suites = list(d.values()) + list(smollm2.values())
    total = sum(s["tests"] for s in suites)
    return f"{total - sum(s['failures'] for s in suites)} of the {total}"


def kv_bytes_ratio(d: dict, context: int) -> float:
    """bf16 KV bytes over int4 KV bytes per decode step at batch 1 (runs 0 and 2 of the 8B bench)."""
    step = [next(r["bandwidth"]["kv_bytes_per_step"] for r in run["results"]
                 if r["context"] == context and r["batch"] == 1) for run in (d["runs"][0], d["runs"][2])]
    return step[0] / step[1]


def unprofiled(d: dict, batch: int, overlap: str | None = None) -> dict:
    """The profile stage's unprofiled bench result at `batch` (and engine.cuda_overlap=overlap where given)."""
    return next(r["results"][0] for r in d["runs"] if r["results"][0]["batch"] == batch
                and (overlap is None or f"engine.cuda_overlap={overlap}" in r["command"]))


def peer(d: dict, batch: int) -> float:
    return next(c["decode_tokens_per_second"] for c in d["decode"] if c["batch"] == batch)


def gpu_speed_row(d: dict, batch: int) -> str:
    """A row of the [gpu-speed] table: overlapped, ordinary, the peer and the ratio (99bdc95's call)."""
    on, off = unprofiled(d, batch, "on"), unprofiled(d, batch, "off")
    torch = peer(load("gpu-h200-99bdc95-torch-compile.json"), batch)
    rate = on["decode_tokens_per_second"]
    fraction = f" ({on['bandwidth']['fraction_of_copy_bandwidth']:.2f} of the copy bandwidth)" if batch == 1 else ""
    return (f"| batch {batch}, tok/s | {rate:,.1f}{fraction} | {off['decode_tokens_per_second']:,.1f} | "
            f"{torch:,.1f} | {rate / torch:.2f}x |")


def gpu_speed_median_row(d: dict) -> str:
    on, off = unprofiled(d, 64, "on"), unprofiled(d, 64, "off")
    median = on["step_seconds"]["median"]
    torch = peer(load("gpu-h200-99bdc95-torch-compile.json"), 64)
    return (f"| batch 64, median step | {median * 1e3:.2f} ms ({64 / median:,.0f} tok/s) | "
            f"{off['step_seconds']['median'] * 1e3:.2f} ms | | {64 / median / torch:.2f}x on the median |")


def gpu_speed_ratios(d: dict) -> tuple[float, float, float, float]:
    """99bdc95's batch-1 fraction of the copy bandwidth and its ratios to torch.compile (batch 1, 64, 64 median)."""
    torch = load("gpu-h200-99bdc95-torch-compile.json")
    one, many = unprofiled(d, 1, "on"), unprofiled(d, 64, "on")
    return (one["bandwidth"]["fraction_of_copy_bandwidth"], one["decode_tokens_per_second"] / peer(torch, 1),
            many["decode_tokens_per_second"] / peer(torch, 64), 64 / many["step_seconds"]["median"] / peer(torch, 64))


def long_cell(d: dict, run: int, batch: int, context: int) -> float:
    return next(c["decode_tokens_per_second"] for c in d["runs"][run]["results"]
                if c["batch"] == batch and c["context"] == context)


def router_summary(d: dict) -> str:
    """Cache-aware routing against one replica alone and round-robin (bench/router.py)."""
    return (f"cache-aware routing served {d['cache_aware']['cache_share']:.1%} of the prompt tokens from the "
            f"replicas' caches (one replica alone: {d['one_replica']['cache_share']:.1%}, round-robin: "
            f"{d['round_robin']['cache_share']:.1%}), with a mean time to first token "
            f"{d['goals']['ttft_mean_round_robin_over_cache_aware']:.2f}x shorter than round-robin's; the router "
            f"added {d['goals']['router_overhead_median_ms']:.2f} ms to the median time to first token")


def router_row(d: dict, run: str) -> str:
    r = d[run]
    return (f"| {r['cache_share']:.1%} | {r['ttft_mean_s']:.2f} s | {r['ttft_median_s']:.2f} s | "
            f"{r['ttft_p90_s']:.2f} s | {r['wall_s']:.0f} s |")


def chunked_retrieval(d: dict) -> str:
    """SnapKV's and PyramidKV's retrieval under chunked prefill, as a share of `full`'s (strata eval)."""
    cases = {c["label"]: c for c in d["cases"]}
    solved = {label: sum(r["correct"] for r in c["retrieval"]) for label, c in cases.items()}
    shares = sorted({round(100 * solved[label] / solved["full"]) for label in ("snapkv@50%", "pyramidkv@50%")})
    span = "-".join(str(s) for s in shares)
    return f"at 50% budgets they keep {span}% of `full`'s retrieval"


def llamacpp_rows(d: dict) -> str:
    """The table rows of bench/results/README.md for one bench/cpu_vs_llamacpp.sh run (tok/s, Strata / llama.cpp)."""
    s = d["summary"]
    rows = [("batch-1 decode (tg64, from an empty cache)", "batch1_decode_tokens_per_second"),
            ("batch-1 decode after 128 tokens (like for like)", "batch1_decode_after_prompt_tokens_per_second"),
            ("batch-8 decode", "batch8_decode_tokens_per_second"),
            ("prefill of 128 tokens", "prefill_tokens_per_second"),
            ("HTTP, 8 concurrent streams", "http_8_streams_tokens_per_second"),
            ("HTTP, one stream", "http_1_stream_tokens_per_second")]
    return " ".join(f"| {label} | {s[key]['llama.cpp']:.1f} | {s[key]['strata']:.1f} | "
                    f"{s[key]['ratio_strata_over_llamacpp']:.2f}x |" for label, key in rows)


def weight_reads(d: dict) -> str:
    """Weight bytes a batch-1 decode step reads per second, as a share of the measured read bandwidth."""
    r = d["summary"]["batch1_decode_weight_reads_of_bandwidth"]
    return (f"{100 * r['strata']:.0f}% of the {r['read_gb_per_s']:.1f} GB/s it measured (llama.cpp "
            f"{100 * r['llama.cpp']:.0f}%)")


def read_share(d: dict) -> str:
    """Strata's batch-1 weight reads as a percentage of the read bandwidth its run measured."""
    return f"{100 * d['summary']['batch1_decode_weight_reads_of_bandwidth']['strata']:.0f}"


def int8_before_after(d: dict) -> str:
    """bench/engine_before_after.sh: decode after / before at batch 1 and 8."""
    m = d["median"]
    return (f"batch-1 decode {m['decode batch 1: after / before']:.2f}x, batch-8 "
            f"{m['decode batch 8: after / before']:.2f}x")


def decode_profile(d: dict, activations: str) -> str:
    """bench/decode_profile.py: the weight products' share of a decode step and how near the bandwidth they read."""
    g = d["groups_percent"]
    return (f"with {activations} activations the weight products take {g['weight products']:.0f}% of the samples "
            f"and stream the weights at {d['weight_products_stream_share_of_read_bandwidth']:.2f} of the read "
            f"bandwidth while they run; attention {g['attention']:.0f}%, the compute pool's waits "
            f"{g['compute pool waits']:.0f}%")


def thread_waits(d: dict) -> str:
    """bench/decode_profile.py by thread: the pool's thread's waits (and read-ahead, if any), the main thread's."""
    threads = d["groups_percent_of_each_thread"]
    main, pool = threads["thread 0 (main)"], threads["thread 1"]
    if pool["read-ahead"] == 0:
        return (f"the pool's thread waited {pool['compute pool waits']:.0f}% of its samples (the main thread "
                f"{main['compute pool waits']:.0f}%)")
    return (f"the pool's thread waits {pool['compute pool waits']:.0f}% of its samples and reads ahead "
            f"{pool['read-ahead']:.0f}% (the main thread waits {main['compute pool waits']:.0f}%)")


def decode_attention_change(after: dict) -> str:
    """build/bench/decode_attention after / before (the before file beside it) per batch, the after's cache rate."""
    before = load("cpu-decode-attention-before-epyc-avx512vnni.json")
    share = {}
    for a, b in zip(after["results"], before["results"]):
        share.setdefault(a["batch"], []).append(a["us"] / b["us"])
    rates = [r["kv_gb_per_s"] for r in after["results"]]
    return (f"batch 1 took {min(share[1]):.2f}-{max(share[1]):.2f} of the time, batch 8 {min(share[8]):.2f}-"
            f"{max(share[8]):.2f}; it reads the cache at {min(rates):.1f}-{max(rates):.1f} GB/s")


def attention_speedups(after: dict, before_name: str) -> dict:
    """build/bench/decode_attention: the time before over after per KV format, as low-high spans (the before file,
    `before_name`, measured the same cases in the same order)."""
    speedup: dict = {}
    for a, b in zip(after["results"], load(before_name)["results"]):
        speedup.setdefault(a["kv"], []).append(b["us"] / a["us"])
    return {kv: f"{min(v):.2f}-{max(v):.2f}" for kv, v in speedup.items()}


def cache_rates(d: dict, kv: str) -> str:
    """build/bench/decode_attention: the low-high rate at which it read one KV format's cache."""
    rates = [r["kv_gb_per_s"] for r in d["results"] if r["kv"] == kv]
    return f"{min(rates):.1f}-{max(rates):.1f}"


def quantized_attention_change(after: dict) -> str:
    """build/bench/decode_attention over quantized pools: before / after time ranges per KV format (the before file
    beside it), and the rates at which the after run reads quantized and f32 blocks."""
    span = attention_speedups(after, "cpu-decode-attention-kv-before-dequantize-avx2.json")
    quantized = [r["kv_gb_per_s"] for r in after["results"] if r["kv"] != "f32"]
    return (f"the time before over after is int8 {span['int8']}, int4 {span['int4']}, int2 {span['int2']}; the f32 "
            f"cases, whose code did not change, {span['f32']}: the spread of this VM between two runs. What is left: "
            f"the quantized blocks are read at {min(quantized):.1f}-{max(quantized):.1f} GB/s of their own bytes, "
            f"where f32 blocks are read at {cache_rates(after, 'f32')}")


def ask_share_attention(after: dict) -> str:
    """build/bench/decode_attention before and after decode attention asked for the next block in shares."""
    span = attention_speedups(after, "cpu-decode-attention-before-ask-share-xeon.json")
    return (f"the time before over after is bf16 {span['bf16']}, f16 {span['f16']}, f32 {span['f32']}; the cache "
            f"read at bf16 {cache_rates(after, 'bf16')} GB/s, f16 {cache_rates(after, 'f16')}, f32 "
            f"{cache_rates(after, 'f32')}")


def engine_decode_after_context(d: dict, context: int) -> str:
    """bench/engine_before_after.sh with --context: decode after / before at batch 1 and 8, with the medians."""
    m = d["median"]
    return "; ".join(f"batch {b} {m[f'decode batch {b} context {context}: after / before']:.2f}x "
                     f"({m[f'before decode batch {b} context {context}']:.1f} to "
                     f"{m[f'after decode batch {b} context {context}']:.1f}" + (" tok/s)" if b == 1 else ")")
                     for b in (1, 8))


def before_after(d: dict) -> str:
    """bench/engine_before_after.sh: decode after / before at batch 1 and 8, with the medians."""
    m = d["median"]
    return "; ".join(f"batch-{b} decode {m[f'decode batch {b}: after / before']:.2f}x "
                     f"({m[f'before decode batch {b}']:.1f} to {m[f'after decode batch {b}']:.1f}"
                     + (" tok/s)" if b == 1 else ")") for b in (1, 8))


def engine_prefill_after_context(d: dict, context: int) -> str:
    """bench/engine_before_after.sh with --context: prefill after / before at batch 1 and 8."""
    m = d["median"]
    return (f"{m[f'prefill batch 1 context {context}: after / before']:.2f}x at batch 1 and "
            f"{m[f'prefill batch 8 context {context}: after / before']:.2f}x at batch 8")


def capacity_row(d: dict, run: str) -> str:
    """bench/capacity.py: one run's row of the table."""
    r = d["runs"][run]
    return (f"| `{run}` | {r['max_decoding_at_once']} ({r['arithmetic_sequences']}) | {r['pool_peak_use']:.2f} | "
            f"{r['decode_tokens_per_second']:.1f} | {r['total_seconds']:.0f} | {r['mean_ttft_seconds']:.1f} |")


def kernel_times(d: dict) -> dict:
    """build/bench/quantized_matmul_paths --int8: microseconds by (matrix, rows of x) and kernel ("in place" named
    "pairs", as the two untiled layouts share their rows)."""
    times: dict = {}
    for r in d["results"]:
        times.setdefault((r["matrix"], r["rows_of_x"]), {})[r["kernel"].replace(" in place", " pairs")] = r["us"]
    return times


def time_ratios(times: dict, numerator: str, denominator: str, rows) -> str:
    """The span of one kernel's time over another's, on every matrix timed with both at those rows of x."""
    values = [k[numerator] / k[denominator] for (_, n), k in times.items()
              if n in rows and numerator in k and denominator in k]
    return f"{min(values):.2f}-{max(values):.2f}x"


def int16_kernels(d: dict) -> str:
    """build/bench/quantized_matmul_paths --int8: the int16 tiles' time against int8's and against the fp32 kernels'."""
    t, int16, int8, fp32 = kernel_times(d), "avx512_vnni rows16 int16", "avx512_vnni rows16", "avx512_vnni pairs fp32"
    return (f"at one row of x int16 takes {time_ratios(t, int16, int8, (1,))} int8's "
            f"time, from 8 rows {time_ratios(t, int16, int8, (8, 16, 32, 64, 128))}; "
            f"the fp32 kernels take {time_ratios(t, fp32, int16, (1,))} int16's time at one row and "
            f"{time_ratios(t, fp32, int16, (8,))} at 8, BLAS on dequantized tiles "
            f"{time_ratios(t, 'fp32 tiles (BLAS)', int16, (128,))} at 128")


def avx2_tiles(d: dict) -> str:
    """The AVX2 int16 tiles against AVX2's fp32 kernels, BLAS and the VNNI int16 tiles."""
    t, tiles, fp32 = kernel_times(d), "avx2 rows16 int16", "avx2 pairs fp32"
    return (f"AVX2's fp32 kernels take {time_ratios(t, fp32, tiles, (1,))} the AVX2 int16 tiles' time at one row "
            f"of x and {time_ratios(t, fp32, tiles, (8,))} at 8, BLAS on dequantized tiles "
            f"{time_ratios(t, 'fp32 tiles (BLAS)', tiles, (128,))} at 128; the AVX2 int16 tiles take "
            f"{time_ratios(t, tiles, 'avx512_vnni rows16 int16', (1,))} the VNNI ones' time at one row and "
            f"{time_ratios(t, tiles, 'avx512_vnni rows16 int16', (128,))} at 128")


def integer_peak(d: dict) -> str:
    """build/bench/integer_product_peak: the VNNI peak and its tile kernels' share of it."""
    p = d["peaks"]["avx512_vnni vpdpbusd zmm"]
    return (f"{p['giga_products_per_second_one_core']:.0f} G products/s on one core, "
            f"{p['giga_products_per_second_all']:.0f} on both; the int16 tiles reach "
            f"{p['tiles_int16_128_rows']['giga_products_per_second']:.0f} ("
            f"{p['tiles_int16_128_rows']['share_of_peak']:.0%}), the int8 ones "
            f"{p['tiles_int8_128_rows']['giga_products_per_second']:.0f} "
            f"({p['tiles_int8_128_rows']['share_of_peak']:.0%})")


def amx_kernels(d: dict) -> str:
    """build/bench/quantized_matmul_paths --int8 where AMX runs: the VNNI tiles' time over the AMX kernel's (Q6_K's
    tiles left out: the amx level sends them to the VNNI kernel)."""
    t = {key: k for key, k in kernel_times(d).items() if "q6_k" not in key[0]}
    spans = {(rows, dtype): time_ratios(t, f"avx512_vnni rows16{dtype}", f"amx rows16{dtype}", (rows,))
             for rows in (16, 128) for dtype in ("", " int16")}
    return (f"the VNNI kernel takes {spans[128, ' int16']} the AMX kernel's time at 128 rows of x with int16 "
            f"activations ({spans[128, '']} with int8) and {spans[16, ' int16']} at 16 rows ({spans[16, '']})")


def prefill_span(d: dict) -> str:
    """bench/engine_before_after.sh: prefill after / before at batch 1 and 8, low-high."""
    values = [d["median"][f"prefill batch {b}: after / before"] for b in (1, 8)]
    return f"{min(values):.2f}-{max(values):.2f}x"


def prefill_before_after(d: dict) -> str:
    """bench/engine_before_after.sh: prefill after / before at batch 1 and 8, of the prompts its command gave."""
    m = d["median"]
    tokens = re.search(r"--prompt-tokens (\d+)", d["command"])
    return (f"prefill of {tokens.group(1) if tokens else 128} tokens {m['prefill batch 1: after / before']:.2f}x at "
            f"batch 1 and {m['prefill batch 8: after / before']:.2f}x at batch 8")


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def decode_span(d: dict) -> str:
    r = ratios(d)
    values = (r["batch1_decode"], r["batch1_decode_after_prompt"], r["batch8_decode"])
    return f"{min(values):.2f} to {max(values):.2f} times"


# The bench/cpu_vs_llamacpp.sh runs whose tables and weight reads bench/results/README.md quotes.
LLAMACPP_RUNS = ("epyc-avx512vnni", "epyc-avx512vnni-int8", "epyc-avx512vnni-b9e8d8b", "epyc-avx512vnni-int8-b9e8d8b",
                 "epyc-avx512vnni-int8-5a23255", "q4km-epyc-avx512vnni", "q4km-epyc-avx512vnni-int8-3b3b1cb",
                 "q4km-epyc-avx512vnni-int8-ea78d88", "q4km-epyc-avx512vnni-int8", "epyc-avx512vnni-int16",
                 "q4km-epyc-avx512vnni-int16", "epyc-avx512vnni-int16-5824a42", "q4km-epyc-avx512vnni-int16-5824a42",
                 "q4km-epyc-avx512vnni-int8-f17136b", "q4km-epyc-at-avx2", "epyc-at-avx2",
                 "q5km-epyc-avx512vnni", "q5km-epyc-at-avx2", "q8-epyc-at-avx2", "epyc-avx512vnni-pool-shares",
                 "q4km-epyc-avx512vnni-pool-shares", "q4km-epyc-at-avx2-pool-shares", "epyc-at-avx2-pool-shares",
                 "q5km-epyc-avx512vnni-pool-shares", "q8-epyc-at-avx2-pool-shares", "q5_0-epyc-avx512vnni",
                 "smollm2-q5km-epyc-avx512vnni", "xeon-amx-noamx", "q4km-xeon-amx-noamx", "xeon-amx-noamx-int8",
                 "xeon-amx-noamx-readahead", "xeon-amx-noamx-far-prefetch", "q4km-xeon-amx-noamx-far-prefetch",
                 "q4km-xeon-amx-noamx-attention-prefetch", "f16-xeon-amx-noamx")

WEIGHT_BYTES = {"f32": "4", "bf16": "2", "e4m3/row": "1 (+ a scale a row)", "e4m3/128": "1.03", "e4m3/32": "1.13",
                "int8/row": "1 (+ a scale a row)", "int8/128": "1.03", "q8_0": "1.06"}


def weight_rounding_row(d: dict, scheme: str) -> str:
    """One row of the weight-rounding table (bench/weight_rounding_quality.cpp)."""
    r = next(r for r in d["schemes"] if r["scheme"] == scheme)
    return (f"| {scheme} | {WEIGHT_BYTES[scheme]} | {100 * r['top1_vs_reference']:.1f}% | "
            f"{100 * r['top1_vs_reference_where_clear']:.1f}% | {100 * r['top1_vs_bf16']:.1f}% | "
            f"{100 * r['perplexity_vs_bf16']:+.2f}% |")


def weight_rounding_prose(d: dict) -> list[str]:
    """The figures bench/results/README.md's prose quotes from the weight-rounding table."""
    r = {r["scheme"]: r for r in d["schemes"]}
    top1 = {scheme: f"{100 * r[scheme]['top1_vs_bf16']:.1f}%" for scheme in r}
    ppl = {scheme: f"{100 * r[scheme]['perplexity_vs_bf16']:+.2f}%" for scheme in r}
    return [f"agrees with bf16 at {top1['e4m3/row']} of the positions and costs {ppl['e4m3/row']} perplexity",
            f"(per 32 values: {top1['e4m3/32']}, {ppl['e4m3/32']})",
            f"flips {100 * (1 - r['e4m3/row']['top1_vs_reference_where_clear']):.1f}% of the clear choices",
            f"({ppl['int8/row']} per channel, {ppl['int8/128']} per 128)",
            f"({top1['int8/row']} and {top1['int8/128']} of all positions agree with bf16)",
            f"changes the top-1 at {100 * (1 - r['bf16']['top1_vs_reference']):.1f}% of the positions"]


def q5_1_before_after(d: dict) -> str:
    m = d["median"]
    return (f"batch-1 decode {m['before decode batch 1']:.1f} to {m['after decode batch 1']:.1f} tok/s "
            f"({m['decode batch 1: after / before']:.2f}x), batch-8 decode {m['before decode batch 8']:.1f} to "
            f"{m['after decode batch 8']:.1f} ({m['decode batch 8: after / before']:.2f}x)")


CLAIMS = [
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx512vnni-pool-shares.json",
          lambda d: f"decodes {decode_span(d)} as fast as llama.cpp on the same file on an AVX-512 EPYC"),
    Claim("README.md", "cpu-vs-llamacpp-q4km-epyc-avx512vnni-pool-shares.json",
          lambda d: f"on a Q4_K_M file {decode_span(d)} (`bench/results/README.md`)"),
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx512vnni-int8.json",
          lambda d: f"{decode_span(d)} with int8 activations"),
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx2.json", lambda d: f"{decode_span(d)} on an AVX2-only one"),
    Claim("README.md", "cpu-vs-llamacpp-smollm2-q5km-epyc-avx512vnni.json", lambda d: (
        f"batch-1 decode {batch1_span(d)}x, batch-8 {ratios(d)['batch8_decode']:.2f}x, prefill "
        f"{ratios(d)['prefill_128']:.2f}x")),
    Claim("README.md", "cpu-q5_1-kept-before-after.json",
          lambda d: f"{d['median']['decode batch 1: after / before']:.2f}x its decode before"),
    Claim("README.md", "cpu-vs-llamacpp-q5_0-epyc-avx512vnni.json",
          lambda d: f"on a Q5_0 file (kept as Q8_0 of the same values) {decode_span(d)}"),
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx512vnni-pool-shares.json",
          lambda d: f"on an AVX-512 VNNI EPYC with the default int16 activations: batch-1 decode {batch1_span(d)}x, "
                    f"batch-8 {ratios(d)['batch8_decode']:.2f}x, prefill {ratios(d)['prefill_128']:.2f}x, HTTP "
                    f"{ratios(d)['http_1_stream']:.2f}x and {ratios(d)['http_8_streams']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx512vnni.json",
          lambda d: f"(f32 activations: {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x)"),
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx512vnni-int8.json",
          lambda d: f"with `engine.activation_dtype: int8` (VNNI on 16-row tiles) {batch1_span(d)}x, "
                    f"{ratios(d)['batch8_decode']:.2f}x and {ratios(d)['prefill_128']:.2f}x"),
    *(Claim("bench/results/README.md", f"cpu-vs-llamacpp-{run}.json", lambda d: llamacpp_rows(d))
      for run in LLAMACPP_RUNS),
    *(Claim("bench/results/README.md", f"cpu-vs-llamacpp-{run}.json", lambda d: weight_reads(d))
      for run in LLAMACPP_RUNS),
    Claim("README.md", "cpu-vs-llamacpp-q4km-epyc-avx512vnni-pool-shares.json",
          lambda d: f"on a Q4_K_M file with int16 activations batch-1 decode {batch1_span(d)}x, batch-8 "
                    f"{ratios(d)['batch8_decode']:.2f}x, prefill {ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-q4km-epyc-avx512vnni-int8-f17136b.json",
          lambda d: f"with int8 {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-q4km-epyc-avx512vnni.json",
          lambda d: f"(f32: {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x)"),
    Claim("bench/results/README.md", "cpu-int16-kernels-epyc-avx512vnni.json", int16_kernels),
    Claim("bench/results/README.md", "cpu-int16-kernels-avx2-tiles-epyc-avx512vnni.json", avx2_tiles),
    Claim("bench/results/README.md", "cpu-integer-product-peak-epyc-avx512vnni.json", integer_peak),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-avx2-level-int16-vs-f32.json", "cpu-q4km-avx2-level-int16-vs-f32.json")
      for check in (before_after, prefill_before_after)),
    Claim("README.md", "cpu-vs-llamacpp-epyc-at-avx2-pool-shares.json", lambda d: f"SmolLM2's file {decode_span(d)}"),
    Claim("README.md", "cpu-vs-llamacpp-q4km-epyc-at-avx2-pool-shares.json",
          lambda d: f"the Q4_K_M one {decode_span(d)})"),
    Claim("README.md", "cpu-q4km-avx2-level-int16-vs-f32.json",
          lambda d: f"the Q4_K_M file's batch-1 decode {d['median']['decode batch 1: after / before']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-q5km-epyc-avx512vnni-pool-shares.json",
          lambda d: f"on a Q5_K_M file batch-1 decode {batch1_span(d)}x, batch-8 "
                    f"{ratios(d)['batch8_decode']:.2f}x, prefill {ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-q8-epyc-at-avx2-pool-shares.json",
          lambda d: f"on a Q8_0 file held to AVX2 batch-1 decode {batch1_span(d)}x, batch-8 "
                    f"{ratios(d)['batch8_decode']:.2f}x, prefill {ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-q5km-kept-before-after.json",
          lambda d: f"batch-1 decode {d['median']['decode batch 1: after / before']:.2f}x as fast as with its Q5_K "
                    f"tensors in fp32"),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-q5km-kept-before-after.json", "cpu-q8-avx2-level-int16-pairs-before-after.json",
                     "cpu-avx2-level-int16-pairs-before-after.json", "cpu-int16-q16-restrict-before-after.json",
                     "cpu-pool-shares-before-after.json", "cpu-q4km-pool-shares-before-after.json")
      for check in (before_after, prefill_before_after)),
    Claim("bench/results/README.md", "cpu-decode-profile-before-pool-shares.json",
          lambda d: f"put the compute pool's waits at {d['groups_percent']['compute pool waits']:.0f}% of the step's "
                    f"samples"),
    Claim("bench/results/README.md", "cpu-decode-profile-pool-shares.json",
          lambda d: f"the waits fell to {d['groups_percent']['compute pool waits']:.0f}%"),
    Claim("bench/results/README.md", "cpu-busy-core-pool-shares.json",
          lambda d: f"with a process spinning on core 1, batch-1 decode ran at {d['median']['after busy batch 1']:.1f} "
                    f"tok/s after and {d['median']['before busy batch 1']:.1f} before, batch 8 at "
                    f"{d['median']['after busy batch 8']:.1f} and {d['median']['before busy batch 8']:.1f}"),
    *(Claim("bench/results/README.md", source, before_after)
      for source in ("cpu-int16-default-before-after.json", "cpu-q4km-int16-default-before-after.json",
                     "cpu-int16-four-rows-before-after.json", "cpu-q4km-int16-four-rows-before-after.json",
                     "cpu-q4km-tiles-no-prefetch-before-after.json",
                     "cpu-q4km-tiles-prefetch-in-prefill-before-after.json",
                     "cpu-tiles-prefetch-in-prefill-before-after.json")),
    *(Claim("bench/results/README.md", source, prefill_before_after)
      for source in ("cpu-int16-default-before-after.json", "cpu-q4km-int16-default-before-after.json",
                     "cpu-int16-four-rows-before-after.json", "cpu-q4km-int16-four-rows-before-after.json",
                     "cpu-q4km-tiles-no-prefetch-before-after.json",
                     "cpu-q4km-tiles-prefetch-in-prefill-before-after.json",
                     "cpu-tiles-prefetch-in-prefill-before-after.json")),
    Claim("bench/results/README.md", "cpu-int8-vnni-before-after.json", int8_before_after),
    Claim("bench/results/README.md", "cpu-q4km-int8-before-after.json", before_after),
    Claim("bench/results/README.md", "cpu-q4km-int8-q6k-before-after.json", before_after),
    Claim("bench/results/README.md", "cpu-decode-split-thp-before-after.json", before_after),
    Claim("bench/results/README.md", "cpu-decode-split-thp-before-after-int8.json", before_after),
    Claim("bench/results/README.md", "cpu-decode-attention-epyc-avx512vnni.json", decode_attention_change),
    Claim("bench/results/README.md", "cpu-decode-attention-kv-dequantize-avx2.json", quantized_attention_change),
    Claim("bench/results/README.md", "cpu-kv-int4-dequantize-avx2-before-after.json",
          lambda d: engine_decode_after_context(d, 4096)),
    Claim("bench/results/README.md", "cpu-kv-int4-vs-f32-4096.json", lambda d: engine_decode_after_context(d, 4096)),
    *(Claim("bench/results/README.md", source, check)
      for source, context in (("cpu-kv-bf16-vs-f32-4k-xeon.json", 4096), ("cpu-kv-f16-vs-f32-4k-xeon.json", 4096),
                              ("cpu-kv-bf16-vs-f32-1k-xeon.json", 1024))
      for check in (lambda d, c=context: engine_decode_after_context(d, c),
                    lambda d, c=context: engine_prefill_after_context(d, c))),
    *(Claim("bench/results/README.md", "cpu-capacity-bf16-xeon.json", lambda d, run=run: capacity_row(d, run))
      for run in ("full:f32", "full:bf16", "snapkv:f32", "snapkv:bf16")),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-attention-tiles-f32-4k-before-after-xeon.json",
                     "cpu-attention-tiles-bf16-4k-before-after-xeon.json",
                     "cpu-attention-tiles-avx2-4k-before-after-xeon.json", "cpu-kv-bf16-vs-f32-4k-tiles-xeon.json")
      for check in (lambda d: engine_decode_after_context(d, 4096), lambda d: engine_prefill_after_context(d, 4096))),
    Claim("bench/results/README.md", "cpu-attention-tiles-short-before-after-xeon.json", before_after),
    Claim("bench/results/README.md", "cpu-attention-tiles-short-before-after-xeon.json", prefill_before_after),
    Claim("bench/results/README.md", "cpu-decode-attention-ask-share-xeon.json", ask_share_attention),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-kv-ask-share-bf16-4k-xeon.json", "cpu-kv-ask-share-f16-4k-xeon.json",
                     "cpu-kv-ask-share-f32-4k-xeon.json", "cpu-kv-bf16-vs-f32-4k-ask-share-xeon.json",
                     "cpu-kv-f16-vs-f32-4k-ask-share-xeon.json")
      for check in (lambda d: engine_decode_after_context(d, 4096), lambda d: engine_prefill_after_context(d, 4096))),
    Claim("bench/results/README.md", "cpu-f16c-f16-weights-before-after-xeon.json", before_after),
    Claim("bench/results/README.md", "cpu-f16c-f16-weights-before-after-xeon.json", prefill_before_after),
    Claim("README.md", "cpu-kv-bf16-vs-f32-4k-tiles-xeon.json",
          lambda d: f"decode {d['median']['decode batch 1 context 4096: after / before']:.2f}x f32's at batch 1 and "
                    f"{d['median']['decode batch 8 context 4096: after / before']:.2f}x at batch 8, prefill "
                    f"{d['median']['prefill batch 1 context 4096: after / before']:.2f}x;"),
    Claim("bench/results/README.md", "cpu-int8-decode-profile-epyc-avx512vnni.json",
          lambda d: decode_profile(d, "int8")),
    Claim("bench/results/README.md", "cpu-f32-decode-profile-epyc-avx512vnni.json",
          lambda d: decode_profile(d, "f32")),
    Claim("bench/results/README.md", "cpu-int8-decode-profile-epyc-avx512vnni-af41533.json",
          lambda d: decode_profile(d, "int8")),
    Claim("bench/results/README.md", "cpu-f32-decode-profile-epyc-avx512vnni-af41533.json",
          lambda d: decode_profile(d, "f32")),
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx2.json",
          lambda d: f"on an AVX2-only EPYC: batch-1 decode {batch1_span(d)}x, batch-8 "
                    f"{ratios(d)['batch8_decode']:.2f}x, prefill {ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-epyc-avx2-int8.json",
          lambda d: f"with `engine.activation_dtype: int8` {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-capacity-chunked.json",
          lambda d: f"decode {d['runs']['snapkv:int4']['max_decoding_at_once']} sequences at once against `full`'s "
                    f"{d['runs']['full:f32']['max_decoding_at_once']}, at "
                    f"{d['decode_ratio_to_full_f32']['snapkv:int4']:.2f}x"),
    Claim("bench/results/README.md", "cpu-capacity-chunked-c2a041b.json",
          lambda d: f"SnapKV on int4 decodes at {d['decode_ratio_to_full_f32']['snapkv:int4']:.2f}× `full`'s rate "
                    f"({d['runs']['snapkv:int4']['decode_tokens_per_second']:.2f} against "
                    f"{d['runs']['full:f32']['decode_tokens_per_second']:.2f} tok/s"),
    Claim("README.md", "../../docs/eval/chunked/chunked.json", chunked_retrieval),
    Claim("bench/results/README.md", "cpu-capacity-chunked-6a13b68.json",
          lambda d: f"PyramidKV on int4 decodes at {d['decode_ratio_to_full_f32']['pyramidkv:int4']:.2f}× `full`'s "
                    f"rate ({d['runs']['pyramidkv:int4']['decode_tokens_per_second']:.2f} against "
                    f"{d['runs']['full:f32']['decode_tokens_per_second']:.2f} tok/s; "
                    f"{d['runs']['pyramidkv:int4']['total_seconds']:,.0f} s against "
                    f"{d['runs']['full:f32']['total_seconds']:,.0f} s) and SnapKV at "
                    f"{d['decode_ratio_to_full_f32']['snapkv:int4']:.2f}× "
                    f"({d['runs']['snapkv:int4']['decode_tokens_per_second']:.2f} tok/s, "
                    f"{d['runs']['snapkv:int4']['total_seconds']:,.0f} s), "
                    f"{d['runs']['snapkv:int4']['max_decoding_at_once']} decoding at once"),
    Claim("README.md", "gpu-h200-c11d038-tests.json",
          lambda d: f"{gpu_tests_passed(d, load('gpu-h200-c11d038-tests-smollm2.json'))} pass, one"),
    Claim("bench/results/README.md", "gpu-h200-c11d038-tests.json",
          lambda d: f"{gpu_tests_passed(d, load('gpu-h200-c11d038-tests-smollm2.json'))} `Cuda*` and NCCL tests pass"),
    Claim("bench/results/README.md", "gpu-h200-c11d038-bench-8b.json",
          lambda d: f"although it reads {kv_bytes_ratio(d, 16384):.1f}x fewer KV bytes"),
    *(Claim("bench/results/README.md", source, lambda d, part=part: shared_compressed(d, part))
      for source in ("cpu-shared-compressed.json", "cpu-shared-compressed-kvzip.json")
      for part in ("memory", "ttft", "answers")),
    Claim("bench/results/README.md", "gpu-h200-99bdc95-profile.json", lambda d: gpu_speed_row(d, 1)),
    Claim("bench/results/README.md", "gpu-h200-99bdc95-profile.json", lambda d: gpu_speed_row(d, 64)),
    Claim("bench/results/README.md", "gpu-h200-99bdc95-profile.json", gpu_speed_median_row),
    Claim("bench/results/README.md", "gpu-h200-6e43633-torch-compile.json",
          lambda d: f"the peer decodes at {peer(d, 1):.1f} tok/s at batch 1 and {peer(d, 64):,.0f} at batch 64 (1K "
                    f"context), against Strata's "
                    f"{unprofiled(load('gpu-h200-6e43633-profile.json'), 1)['decode_tokens_per_second']:.1f} and "
                    f"{unprofiled(load('gpu-h200-6e43633-profile.json'), 64)['decode_tokens_per_second']:,.0f}"),
    Claim("bench/results/README.md", "gpu-h200-99bdc95-bench-8b-long.json",
          lambda d: f"int4 KV still decodes no faster than bf16 KV ({long_cell(d, 1, 8, 32768):.1f} against "
                    f"{long_cell(d, 0, 8, 32768):.1f} tok/s at 32K, batch 8), SnapKV at 1,024 keeps "
                    f"{long_cell(d, 2, 1, 32768):.1f} tok/s at batch 1 and {long_cell(d, 2, 8, 32768):.1f} at batch "
                    f"8 at 32K"),
    Claim("bench/results/README.md", "gpu-h200-6e43633-tests.json",
          lambda d: f"{d['kernels_tests']['tests'] - d['kernels_tests']['failures']} of the "
                    f"{d['kernels_tests']['tests']} `Cuda*` kernel tests, the {d['parallel_tests']['tests']} NCCL and "
                    f"the {load('gpu-h200-6e43633-tests-smollm2.json')['kernels_tests']['tests']} SmolLM2 tests pass"),
    Claim("bench/results/README.md", "gpu-h200-99bdc95-tests.json",
          lambda d: f"all {d['kernels_tests']['tests']} kernel tests"),
    Claim("README.md", "gpu-h200-99bdc95-profile.json",
          lambda d: "reaches {:.2f} of the copy bandwidth (the goal is 0.75) and {:.2f}x torch.compile with CUDA "
                    "graphs, batch 64 {:.2f}x on the mean and {:.2f}x on the median step".format(*gpu_speed_ratios(d))),
    Claim("README.md", "gpu-h200-99bdc95-profile.json",
          lambda d: "and at {1:.2f}x (batch 1) and {2:.2f}x (batch 64) PyTorch compiled with CUDA graphs".format(
              *gpu_speed_ratios(d))),
    Claim("bench/results/README.md", "cpu-q5_0-as-q8_0-before-after.json",
          lambda d: "batch-1 decode {:.1f} to {:.1f} tok/s ({:.2f}x), batch-8 decode {:.1f} to {:.1f} ({:.2f}x), "
                    "prefill of 128 tokens {:.2f}x at batch 1 and {:.2f}x at batch 8".format(
                        *(d["median"][k] for k in ("before decode batch 1", "after decode batch 1",
                                                   "decode batch 1: after / before", "before decode batch 8",
                                                   "after decode batch 8", "decode batch 8: after / before",
                                                   "prefill batch 1: after / before",
                                                   "prefill batch 8: after / before")))),
    Claim("README.md", "router-cpu.json", router_summary),
    Claim("bench/results/README.md", "router-cpu.json", router_summary),
    *(Claim("bench/results/README.md", "router-cpu.json", lambda d, run=run: router_row(d, run))
      for run in ("cache_aware", "round_robin", "one_replica")),
    *(Claim("bench/results/README.md", "weight-rounding-quality-smollm2.json",
            lambda d, scheme=scheme: weight_rounding_row(d, scheme)) for scheme in WEIGHT_BYTES),
    *(Claim("bench/results/README.md", "weight-rounding-quality-smollm2.json",
            lambda d, i=i: weight_rounding_prose(d)[i]) for i in range(6)),
    Claim("bench/results/README.md", "cpu-q5_1-kept-before-after.json", q5_1_before_after),
    Claim("bench/results/README.md", "cpu-int8-kernels-xeon-amx.json", amx_kernels),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-decode-profile-xeon-before-read-ahead.json", "cpu-decode-profile-xeon-read-ahead.json")
      for check in (lambda d: decode_profile(d, "int16"), thread_waits)),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-read-ahead-before-after-xeon.json", "cpu-read-ahead-q4km-before-after-xeon.json",
                     "cpu-far-prefetch-before-after-xeon.json", "cpu-far-prefetch-q4km-before-after-xeon.json")
      for check in (before_after, prefill_before_after)),
    Claim("bench/results/README.md", "cpu-attention-prefetch-before-after-xeon.json", before_after),
    Claim("bench/results/README.md", "cpu-far-prefetch-avx2-q4km-before-after-xeon.json", before_after),
    Claim("bench/results/README.md", "cpu-far-prefetch-f32-before-after-xeon.json", before_after),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-half-weights-f16-before-after-xeon.json", "cpu-prefill-tiles-f32-before-after-xeon.json",
                     "cpu-half-weights-f16-avx2-before-after-xeon.json")
      for check in (before_after, prefill_before_after)),
    Claim("bench/results/README.md", "cpu-vs-llamacpp-f16-xeon-amx-noamx.json",
          lambda d: f"The prefill of a batch of 8 prompts: "
                    f"{d['summary']['batch8_prefill_tokens_per_second']['ratio_strata_over_llamacpp']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-f16-xeon-amx-noamx.json",
          lambda d: f"SmolLM2 written as F16 {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-half-weights-f16-before-after-xeon.json",
          lambda d: f"batch-1 decode {d['median']['decode batch 1: after / before']:.2f}x as fast);"),
    Claim("README.md", "cpu-read-ahead-before-after-xeon.json",
          lambda d: f"batch-1 decode {d['median']['decode batch 1: after / before']:.2f}x as fast on SmolLM2's file"),
    *(Claim("README.md", source, lambda d, what=what: f"{what} {prefill_span(d)}")
      for source, what in (("cpu-amx-before-after-xeon.json", "prefill"),
                           ("cpu-amx-q4km-before-after-xeon.json", "on a Q4_K_M file"))),
    *(Claim("bench/results/README.md", source, check)
      for source in ("cpu-amx-before-after-xeon.json", "cpu-amx-q4km-before-after-xeon.json")
      for check in (before_after, prefill_before_after)),
    Claim("README.md", "cpu-vs-llamacpp-xeon-amx-noamx-far-prefetch.json",
          lambda d: f"SmolLM2's file batch-1 decode {batch1_span(d)}x, batch-8 {ratios(d)['batch8_decode']:.2f}x, "
                    f"prefill {ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-xeon-amx-noamx-far-prefetch.json",
          lambda d: f"reading the weights at {read_share(d)}% of the read bandwidth measured"),
    Claim("README.md", "cpu-vs-llamacpp-q4km-xeon-amx-noamx-attention-prefetch.json",
          lambda d: f"Q4_K_M one {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x (at {read_share(d)}% of it)"),
    Claim("README.md", "cpu-vs-llamacpp-xeon-amx-noamx.json",
          lambda d: f"SmolLM2's file batch-1 decode {batch1_span(d)}x, batch-8 {ratios(d)['batch8_decode']:.2f}x, "
                    f"prefill {ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-q4km-xeon-amx-noamx.json",
          lambda d: f"the Q4_K_M one {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x"),
    Claim("README.md", "cpu-vs-llamacpp-xeon-amx-noamx-int8.json",
          lambda d: f"with int8 activations {batch1_span(d)}x, {ratios(d)['batch8_decode']:.2f}x and "
                    f"{ratios(d)['prefill_128']:.2f}x"),
]


def shared_compressed(d: dict, part: str) -> str:
    memory, _, ttft_mean, ttft_median = list(d["ratios"].values())[:4]
    equal = d["answers_equal"]
    return {"memory": f"**Memory: {memory:.3f} of the per-request copies** (goal: at most 1/4)",
            "ttft": f"**Time to first token: {ttft_mean:.2f}x today's cache hit on the mean, {ttft_median:.2f}x on "
                    f"the median**",
            "answers": f"**Answers: {equal['shared = alone']['tokens']} of {equal['of']} shared and "
                       f"{equal['copies = alone']['tokens']} of {equal['of']} copies equal the question asked "
                       f"alone**"}[part]


def main() -> int:
    failed = 0
    for claim in CLAIMS:
        document = " ".join((ROOT / claim.document).read_text(encoding="utf-8").split())
        text = " ".join(claim.text(load(claim.source)).split())
        found = text in document
        failed += not found
        print(f"{'ok ' if found else 'NOT FOUND'} {claim.document} <- {claim.source}: {text!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
