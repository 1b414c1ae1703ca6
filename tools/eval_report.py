#!/usr/bin/env python3
"""Turns the JSON of `strata eval` into a markdown report and PNG plots.

    .venv/bin/python tools/eval_report.py RESULTS.json [MORE.json ...] --out docs/eval [--timing-before OLD.json]

writes OUT/README.md and OUT/*.png: whether the goal (10x less KV memory for at most +1% perplexity, the upper end
of its 95% interval at most +2%, and 95% of full's retrieval) was reached, the best row at 5x, 10x and 20x less
memory, the quality-memory Pareto front, the table of every row (perplexity increase with a bootstrap interval over
documents, long generation, retrieval, passkey, agreement, compression), retrieval by length and depth, RULER
per task in both settings (tools/ruler_report.py), the per-layer occupancy and the passkey grid. Every number is computed here from the raw results, copied beside it.

A row is identified by its label (snapkv@128, simlayerkv@20%+int4, full). Files merge task by task: a label met
again in a later file is the same row, which takes from it the tasks it had not measured yet (the perplexity of one
run, the retrieval of another), and keeps the first measurement of a task measured twice under the same settings.
A task measured again under other settings (other prefixes, say), or a file whose model or engine settings differ,
makes a row of its own, tagged with its file. Each task of a row is compared with the `full` of the file it came
from; a merged row's memory sums the cases it took tasks from.
"""
import argparse
import json
import math
import os
import re
import shutil
import sys
from collections import Counter, defaultdict, namedtuple
from dataclasses import dataclass

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ruler_report import (is_full, plot_ruler, relative_ruler, ruler_goal, ruler_section,  # noqa: E402
                          savings_tables)

RESAMPLES = 10_000
SEED = 1
SAVINGS = (5, 10, 20)
GOAL_RATIO, GOAL_INCREASE, GOAL_UPPER, GOAL_RETRIEVAL = 10.0, 0.01, 0.02, 0.95
# Settings that only choose which rows a run measures, or schedule them (shared prefill is bit-exact against
# prefilling alone); the others must agree for two files' rows of one label to be one row.
ROW_SELECTION = {"policies", "budgets", "quantized_policies", "quantized_dtype", "quantized_dtypes", "shared_prefill"}
# Each task's results and the settings that decide what it measured: two files' results of one task merge only
# where these agree.
TASK_SETTINGS = {
    "perplexity": ("documents", "perplexity_prefixes", "perplexity_tokens"),
    "long_generation": ("documents", "long_documents", "long_prompt", "long_tokens"),
    "retrieval": ("retrieval_lengths", "retrieval_depths", "retrieval_trials", "seed"),
    "ruler": ("ruler_lengths", "ruler_trials", "ruler_settings", "seed"),
    "passkey": ("passkey_lengths", "passkey_depths", "seed"),
    "agreement": ("documents", "agreement_context", "agreement_prompts", "agreement_tokens"),
}
# Tasks whose results are cases seeded one by one (eval/ruler_tasks.h: the seed mixes the task, the length and the
# trial): two files of the same settings measured the same cases where these keys agree, so their results merge
# case by case (a run of three RULER tasks adds what a run of the others lacks).
CASE_KEYS = {"ruler": ("task", "length", "trial", "setting")}
CASE_SELECTION = {"ruler_tasks"}  # which of those cases a run measures

Estimate = namedtuple("Estimate", "value low high")


@dataclass(eq=False)
class Row:
    name: str  # the label, tagged with its file where the label was measured under different settings
    series: str  # the name without the budget: one line of the quality-against-memory plot
    case: dict  # the row's results, task by task from the files it merges (MergedCase)
    stats: dict  # summarize(case, the `full` results of the files its tasks came from)
    settings: dict  # task -> the settings of the run it came from


def dtype_suffix(case):
    return "+" + case["kv_dtype"] if case.get("kv_dtype", "f32") != "f32" else ""


def case_label(case):
    """The row's name: its "label", or for files written before labels, policy@budget+dtype."""
    if case.get("label"):
        return case["label"]
    return case["policy"] + ("@" + case["budget"] if case["budget"] else "") + dtype_suffix(case)


def budget_key(budget):
    """No budget first, then token budgets (ascending), then fractions (ascending)."""
    if budget.endswith("%"):
        return (1, float(budget[:-1]))
    return (0, float(budget)) if budget else (-1, 0.0)


def measured_under(run, case):
    """What must agree for two files' rows of one label to be one row: model, backend, the settings no task owns
    (batch, prefill chunk), when the policies run (the case's prefill, chunked or end, which auto decides per
    policy; files before it: the run's kv_cache.prefill_compression, or end), policy spec."""
    owned = ROW_SELECTION.union(CASE_SELECTION, *TASK_SETTINGS.values())
    settings = {k: v for k, v in run.get("settings", {}).items() if k not in owned}
    prefill = run.get("prefill_compression", {"mode": "end"})
    mode = case.get("prefill_compression", prefill.get("mode"))  # per case since auto (files before it: the run's)
    prefill = "end" if mode == "end" else f"chunked:{prefill.get('chunk')}"
    return json.dumps([run.get("model"), run.get("backend"), settings, prefill, spec_of_row(case)], sort_keys=True)


def spec_of_row(case):
    """The case's example spec, its numbers masked where the budget is a share of the prompt: the example is
    resolved at the run's longest prompt (`simlayerkv:window=3964` at 7,936 tokens, 3496 at 7,000), so those
    numbers differ between runs of different tasks while the row is the same."""
    spec = case.get("example_spec")
    return re.sub(r"\d+(\.\d+)?", "#", spec) if spec and str(case.get("budget", "")).endswith("%") else spec


def task_settings(run, task):
    return json.dumps({k: run.get("settings", {}).get(k) for k in TASK_SETTINGS[task]}, sort_keys=True)


def baseline(run, source):
    """The run's `full` row: at f32, or at the run's 16-bit pool format (`full+bf16`) where it ran on one."""
    fulls = sorted((case for case in run["cases"] if is_full(case)), key=lambda c: c.get("kv_dtype", "f32") != "f32")
    if not fulls:
        raise SystemExit(f"{source}: no `full` row to compare the others with")
    return fulls[0]


class MergedCase:
    """One row's results gathered task by task from the files that measured it, with the `full` results each task
    is compared with."""

    def __init__(self, source):
        self.source = source  # the first file: the row's tag when its label has several rows
        self.case, self.full = None, {}
        self.settings = {}  # task -> the settings of the run it came from
        self.measured = {}  # task -> its task_settings

    def accepts(self, measured):
        return all(self.measured.get(task, key) == key for task, key in measured.items())

    def add(self, run, case, full, measured):
        new = {task: key for task, key in measured.items() if task not in self.measured}
        extended = {task: self._new_cases(task, case[task], full.get(task, []))
                    for task in measured if task in self.measured and task in CASE_KEYS}
        extended = {task: items for task, items in extended.items() if items[0]}
        if self.case is None:
            self.case = {**case, **{task: [] for task in TASK_SETTINGS}, "memory": dict(case["memory"])}
        elif not new and not extended:
            return
        else:
            self.case["memory"] = merged_memory(self.case["memory"], case["memory"])
        for task in new:
            self.case[task], self.full[task] = case[task], full.get(task, [])
            self.settings[task] = {k: run.get("settings", {}).get(k) for k in TASK_SETTINGS[task]}
        for task, (items, full_items) in extended.items():
            self.case[task] = self.case[task] + items
            self.full[task] = self.full[task] + full_items
        self.measured.update(new)

    def _new_cases(self, task, items, full_items):
        """The results of `items` (and of `full`'s) for cases this row has not measured yet."""
        def key(item):
            return tuple(item[k] for k in CASE_KEYS[task])
        have, have_full = {key(i) for i in self.case[task]}, {key(i) for i in self.full[task]}
        return [i for i in items if key(i) not in have], [i for i in full_items if key(i) not in have_full]


def merged_memory(a, b):
    """Two cases' memory as one: bytes summed per layer; the occupancy of the longer prompt."""
    if len(a["bytes"]) != len(b["bytes"]):
        raise SystemExit("eval_report: rows of one label with different layer counts")
    held = [x + y for x, y in zip(a["bytes"], b["bytes"])]
    full = [x + y for x, y in zip(a["uncompressed_bytes"], b["uncompressed_bytes"])]
    longest = max(a, b, key=lambda m: m.get("longest_prompt", 0))
    merged = {**longest, "bytes": held, "uncompressed_bytes": full,
              "ratio": sum(full) / sum(held) if sum(held) else 0.0}
    # Older files lack a peak or the full-precision share: then the merged row has none either.
    for key in ("peak_bytes", "peak_ratio", "full_precision_bytes", "peak_full_precision_bytes"):
        merged.pop(key, None)
        if key != "peak_ratio" and key in a and key in b:
            merged[key] = a[key] + b[key]
    if "peak_bytes" in merged:
        merged["peak_ratio"] = sum(full) / merged["peak_bytes"] if merged["peak_bytes"] else 0.0
    return merged


def collect_rows(runs, sources):
    """One Row per label (per label and settings where files disagree), `full` first, then by policy and budget."""
    merged = defaultdict(list)  # (label, measured_under) -> its MergedCases
    for run, source in zip(runs, sources):
        full = baseline(run, source)
        for case in run["cases"]:
            measured = {task: task_settings(run, task) for task in TASK_SETTINGS if case.get(task)}
            candidates = merged[(case_label(case), measured_under(run, case))]
            into = next((m for m in candidates if m.accepts(measured)), None)
            if into is None:
                into = MergedCase(source)
                candidates.append(into)
            into.add(run, case, full, measured)
    meanings = Counter(name for (name, _), cases in merged.items() for _ in cases)
    rows = []
    for (name, _), cases in merged.items():
        for m in cases:
            tag = f" [{m.source}]" if meanings[name] > 1 else ""
            series = name if is_full(m.case) else m.case["policy"] + dtype_suffix(m.case)
            rows.append(Row(name + tag, series + tag, m.case, summarize(m.case, m.full), m.settings))
    return sorted(rows, key=lambda r: (not is_full(r.case), r.series, budget_key(r.case["budget"])))


def bootstrap_mean(values, resamples=RESAMPLES, seed=SEED):
    """The mean of per-document values with its 95% percentile bootstrap interval (documents resampled)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return None
    picks = np.random.default_rng(seed).integers(0, values.size, size=(resamples, values.size))
    low, high = np.percentile(values[picks].mean(axis=1), [2.5, 97.5])
    return Estimate(float(values.mean()), float(low), float(high))


def t_quantile(p, df):
    """The p-quantile of Student's t with df degrees of freedom (p > 0.5): bisection on its distribution function,
    integrated from the density by Simpson's rule (no SciPy here)."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t, steps=2000):
        xs = np.linspace(0.0, t, steps + 1)
        ys = np.exp(log_norm - (df + 1) / 2 * np.log1p(xs * xs / df))
        return 0.5 + (t / steps / 3) * (ys[0] + ys[-1] + 4 * ys[1:-1:2].sum() + 2 * ys[2:-1:2].sum())

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def t_interval(values):
    """The mean of per-document values with its 95% Student t interval; None below two documents."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    half = t_quantile(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    return Estimate(float(values.mean()), float(values.mean() - half), float(values.mean() + half))


def spread(values):
    """The lowest and highest per-document value, as an Estimate around the mean."""
    values = np.asarray(values, dtype=float)
    return None if values.size == 0 else Estimate(float(values.mean()), float(values.min()), float(values.max()))


def increases(entries, full_entries):
    """{(document, prefix): exp(mean NLL − mean NLL of full) − 1} over the pairs both measured."""
    ref = {(e["document"], e["prefix"]): e["mean_nll"] for e in full_entries}
    return {(e["document"], e["prefix"]): math.exp(e["mean_nll"] - ref[(e["document"], e["prefix"])]) - 1.0
            for e in entries if (e["document"], e["prefix"]) in ref}


def per_document(incs, prefix=None):
    """Each document's mean increase over its prefixes (or at one prefix), in document order."""
    by_document = defaultdict(list)
    for (document, p), value in incs.items():
        if prefix is None or p == prefix:
            by_document[document].append(value)
    return [sum(v) / len(v) for _, v in sorted(by_document.items())]


def tally(items, key):
    """{key(item): (correct, total)}."""
    counts = defaultdict(lambda: [0, 0])
    for item in items:
        counts[key(item)][0] += bool(item["correct"])
        counts[key(item)][1] += 1
    return {k: tuple(v) for k, v in counts.items()}


def share(correct_total):
    return correct_total[0] / correct_total[1]


def mean_or_none(values):
    values = list(values)
    return sum(values) / len(values) if values else None


def relative_retrieval(items, full_items):
    """The row's retrieval accuracy over full's: per length and overall (None where full found nothing)."""
    mine, ref = tally(items, lambda r: r["length"]), tally(full_items, lambda r: r["length"])
    by_length = {n: share(mine[n]) / share(ref[n]) if ref[n][0] else None for n in sorted(ref) if n in mine}
    accuracy = mean_or_none(bool(r["correct"]) for r in items)
    full_accuracy = mean_or_none(bool(r["correct"]) for r in full_items)
    return by_length, accuracy / full_accuracy if accuracy is not None and full_accuracy else None


def summarize(case, full):
    """The numbers of one row, against the `full` row of its file."""
    incs = increases(case.get("perplexity", []), full.get("perplexity", []))
    long_incs = increases(case.get("long_generation", []), full.get("long_generation", []))
    by_length, retrieval = relative_retrieval(case.get("retrieval", []), full.get("retrieval", []))
    agreement = case.get("agreement", [])
    ratio = case["memory"]["ratio"]
    return {
        "ppl": bootstrap_mean(per_document(incs)),
        "ppl_t": t_interval(per_document(incs)),
        "ppl_spread": spread(per_document(incs)),
        "ppl_by_prefix": {p: bootstrap_mean(per_document(incs, p)) for p in sorted({p for _, p in incs})},
        "long_generation": bootstrap_mean(per_document(long_incs)),
        "long_generation_ratio": mean_or_none(g["memory_ratio"] for g in case.get("long_generation", [])
                                              if "memory_ratio" in g),
        "retrieval": retrieval,
        "retrieval_by_length": by_length,
        "retrieval_accuracy": mean_or_none(bool(r["correct"]) for r in case.get("retrieval", [])),
        "ruler": relative_ruler(case.get("ruler", []), full.get("ruler", [])),
        "passkey": mean_or_none(bool(p["correct"]) for p in case.get("passkey", [])),
        "prefix": mean_or_none(a["common_prefix"] / max(1, a["compared"]) for a in agreement),
        "exact": mean_or_none(a["common_prefix"] == a["compared"] for a in agreement),
        "f1": mean_or_none(a["token_f1"] for a in agreement),
        "ratio": ratio,
        "peak_ratio": case["memory"].get("peak_ratio"),
        "kept": 1.0 / ratio if ratio else None,
    }


def scored(rows):
    return [r for r in rows if r.stats["ppl"] is not None]


def dominates(a, b):
    """a saves at least as much memory for at most the perplexity increase of b, and is strictly better in one."""
    ra, rb, ia, ib = a.stats["ratio"], b.stats["ratio"], a.stats["ppl"].value, b.stats["ppl"].value
    return ra >= rb and ia <= ib and (ra > rb or ia < ib)


def pareto_front(rows):
    """The rows no other row dominates, by ascending compression ratio."""
    candidates = scored(rows)
    front = [r for r in candidates if not any(dominates(o, r) for o in candidates)]
    return sorted(front, key=lambda r: r.stats["ratio"])


def best_at(rows, saving):
    """Among the rows with at least `saving`× less KV memory, the lowest perplexity increase (None if none)."""
    candidates = [r for r in scored(rows) if r.stats["ratio"] >= saving]
    return min(candidates, key=lambda r: (r.stats["ppl"].value, -r.stats["ratio"]), default=None)


def perplexity_shortfalls(row):
    """The goal's perplexity terms this row misses, with its numbers."""
    s, misses = row.stats, []
    if s["ppl"] is None:
        return ["perplexity not measured"]
    if s["ppl"].value > GOAL_INCREASE:
        misses.append(f"perplexity increase {pct(s['ppl'].value)} > {pct(GOAL_INCREASE, '+.0f')}")
    if s["ppl"].high > GOAL_UPPER:
        misses.append(f"upper end of its interval {pct(s['ppl'].high)} > {pct(GOAL_UPPER, '+.0f')}")
    return misses


def quality_shortfalls(row):
    """The goal's quality terms this row misses, with its numbers; empty when it meets them all."""
    s, misses = row.stats, perplexity_shortfalls(row)
    if s["retrieval"] is None:
        misses.append("retrieval not measured (or `full` found nothing)")
    elif s["retrieval"] < GOAL_RETRIEVAL:
        misses.append(f"retrieval {pct(s['retrieval'], '.0f')} of full's < {pct(GOAL_RETRIEVAL, '.0f')}")
    return misses


def goal_shortfalls(row):
    ratio = row.stats["ratio"]
    return ([f"compression {ratio:.2f}× < {GOAL_RATIO:g}×"] if ratio < GOAL_RATIO else []) + quality_shortfalls(row)


def pct(x, spec="+.2f"):
    return "–" if x is None else f"{100 * x:{spec}}%"


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def fmt_estimate(e):
    return "–" if e is None else f"{pct(e.value)} [{pct(e.low)}, {pct(e.high)}]"


def fmt_long_generation(stats):
    """The long-generation increase, flagged where the row held everything (its budget above prompt and generation,
    or a policy that decides at the prompt's end only): there it measures nothing of the policy."""
    text = fmt_estimate(stats["long_generation"])
    ratio = stats.get("long_generation_ratio")
    return text + " (compressed nothing)" if ratio is not None and ratio < 1.05 else text


def fmt_bounds(e):
    return "–" if e is None else f"[{pct(e.low)}, {pct(e.high)}]"


def row_facts(row):
    """One line on a row: compression, perplexity increase with its interval, retrieval, long generation."""
    s = row.stats
    return (f"**{row.name}** at {s['ratio']:.2f}× less KV memory: perplexity {fmt_estimate(s['ppl'])}, "
            f"retrieval {pct(s['retrieval'], '.0f')} of full's, long generation {fmt_long_generation(s)}")


def goal_section(rows):
    goal = (f"At {GOAL_RATIO:g}× less KV memory, a perplexity increase of at most {pct(GOAL_INCREASE, '.0f')} (the "
            f"upper end of its 95% interval at most {pct(GOAL_UPPER, '.0f')}) and at least "
            f"{pct(GOAL_RETRIEVAL, '.0f')} of `full`'s retrieval accuracy.")
    reached = [r for r in scored(rows) if not goal_shortfalls(r)]
    if reached:
        return goal + "\n\n**Reached** by:\n\n" + "\n".join(f"- {row_facts(r)}." for r in reached)
    at_goal = [r for r in scored(rows) if r.stats["ratio"] >= GOAL_RATIO]
    retaining = [r for r in at_goal if r.stats["retrieval"] is not None and r.stats["retrieval"] >= GOAL_RETRIEVAL]
    closest = [
        ("The lowest upper end of the interval among the rows at ≥{:g}× that keep ≥{} of full's retrieval",
         min(retaining, key=lambda r: r.stats["ppl"].high, default=None)),
        ("The lowest perplexity increase at ≥{:g}×", best_at(rows, GOAL_RATIO)),
        ("The most compressed row other than `full` that meets the terms on quality (perplexity, its interval, "
         "retrieval)", max((r for r in scored(rows) if not is_full(r.case) and not quality_shortfalls(r)),
                           key=lambda r: r.stats["ratio"], default=None)),
    ]
    lines = [goal, "", "**Not reached:** no row meets all four terms. The closest, three ways:", ""]
    for what, row in closest:
        what = what.format(GOAL_RATIO, pct(GOAL_RETRIEVAL, ".0f"))
        lines.append(f"- {what}: none." if row is None else
                     f"- {what}: {row_facts(row)}. In the way: {'; '.join(goal_shortfalls(row))}.")
    return "\n".join(lines)


def best_table(rows):
    lines = ["| less KV memory | best row | compression ratio | perplexity increase [95% CI] | "
             "retrieval (% of full) | long generation [95% CI] |",
             "|---|---|---|---|---|---|"]
    for saving in SAVINGS:
        row = best_at(rows, saving)
        if row is None:
            lines.append(f"| ≥{saving}× | no row saves this much | – | – | – | – |")
            continue
        s = row.stats
        lines.append(f"| ≥{saving}× | {row.name} | {s['ratio']:.2f}× | {fmt_estimate(s['ppl'])} | "
                     f"{pct(s['retrieval'], '.0f')} | {fmt_long_generation(s)} |")
    return "\n".join(lines)


def front_table(front):
    lines = ["| row | compression ratio | perplexity increase [95% CI] | long generation [95% CI] | "
             "retrieval (% of full) |",
             "|---|---|---|---|---|"]
    for row in front:
        s = row.stats
        lines.append(f"| {row.name} | {s['ratio']:.2f}× | {fmt_estimate(s['ppl'])} | "
                     f"{fmt_long_generation(s)} | {pct(s['retrieval'], '.0f')} |")
    return "\n".join(lines)


def row_table(rows):
    lines = [
        "| row | perplexity increase [95% bootstrap CI] | [95% t-interval] | [per-document range] | "
        "long generation [95% CI] | retrieval (% of full) | passkey accuracy | "
        "agreement: common prefix | agreement: all tokens equal | agreement: token F1 | compression ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = row.stats
        lines.append(
            f"| {row.name} | {fmt_estimate(s['ppl'])} | {fmt_bounds(s['ppl_t'])} | {fmt_bounds(s['ppl_spread'])} "
            f"| {fmt_long_generation(s)} "
            f"| {pct(s['retrieval'], '.0f')} | {fmt(s['passkey'], '.0%')} | {fmt(s['prefix'], '.0%')} "
            f"| {fmt(s['exact'], '.0%')} | {fmt(s['f1'], '.2f')} | {fmt(s['ratio'], '.2f')}× |")
    return "\n".join(lines)


def bf16_basis(case, at):
    """The saving against a bf16 cache (the CUDA path's entries), at the jobs' ends or at their peaks: there `full`'s
    entries and the row's full-precision ones (a quantized pool's unsealed entries, a prefill chunk) halve, while
    quantized and coded blocks keep their size. Files before the full-precision share was recorded: a
    full-precision row saves as much; a quantized row half as much at the end (its unsealed group counted as codes),
    and at the peak, which may be all unsealed entries (a prompt prefilled whole), nothing is said."""
    memory = case["memory"]
    ratio = memory["ratio"] if at == "end" else memory.get("peak_ratio")
    held = sum(memory["bytes"]) if at == "end" else memory.get("peak_bytes")
    fp = memory.get("full_precision_bytes" if at == "end" else "peak_full_precision_bytes")
    quantized = case.get("kv_dtype", "f32") != "f32"
    if ratio is None or (fp is None and quantized and at == "peak"):  # a peak's unsealed share is unknown
        return None
    if fp is None:
        return ratio / 2 if quantized else ratio
    return sum(memory["uncompressed_bytes"]) / (2 * held - fp) if held else None


def memory_table(rows):
    """Each row's saving at the end of its jobs and at their peak (prefill included), on both bases."""
    lines = ["| row | at the end, f32 basis | at the peak, f32 basis | at the end, bf16 basis | at the peak, bf16 basis |",
             "|---|---|---|---|---|"]
    for row in rows:
        end, peak = row.stats["ratio"], row.stats["peak_ratio"]
        if row.case.get("kv_dtype") in ("f16", "bf16"):  # a 16-bit pool's ratios are on the bf16 basis already
            cells = [x * 2 if x is not None else None for x in (end, peak)] + [end, peak]
        else:
            cells = [end, peak, bf16_basis(row.case, "end"), bf16_basis(row.case, "peak")]
        lines.append(f"| {row.name} | " + " | ".join(fmt(x, '.2f') + ("×" if x is not None else "") for x in cells)
                     + " |")
    return "\n".join(lines)


def prefix_table(rows):
    """The perplexity increase at each prefix length and overall; None when one length was measured."""
    prefixes = sorted({p for r in rows for p in r.stats["ppl_by_prefix"]})
    if len(prefixes) < 2:
        return None
    lines = ["| row | " + " | ".join(f"{p} tokens [95% CI]" for p in prefixes) + " | overall [95% CI] |",
             "|---|" + "---|" * (len(prefixes) + 1)]
    for row in scored(rows):
        cells = [fmt_estimate(row.stats["ppl_by_prefix"].get(p)) for p in prefixes]
        lines.append(f"| {row.name} | " + " | ".join(cells) + f" | {fmt_estimate(row.stats['ppl'])} |")
    return "\n".join(lines)


def full_retrieval_table(full_row):
    """`full`'s retrieval accuracy per length (rows) and depth (columns), with the counts."""
    cells = tally(full_row.case["retrieval"], lambda r: (r["length"], r["depth"]))
    lengths, depths = sorted({n for n, _ in cells}), sorted({d for _, d in cells})
    lines = ["| length | " + " | ".join(f"depth {d:.0%}" for d in depths) + " |", "|---|" + "---|" * len(depths)]
    for n in lengths:
        marks = [f"{share(cells[n, d]):.0%} ({cells[n, d][0]}/{cells[n, d][1]})" if (n, d) in cells else "–"
                 for d in depths]
        lines.append(f"| {n} | " + " | ".join(marks) + " |")
    return "\n".join(lines)


def retrieval_table(rows):
    """Every row's retrieval accuracy per length and overall, as a share of its file's `full`."""
    lengths = sorted({n for r in rows for n in r.stats["retrieval_by_length"]})
    lines = ["| row | " + " | ".join(f"{n} tokens" for n in lengths) + " | overall | accuracy |",
             "|---|" + "---|" * (len(lengths) + 2)]
    for row in rows:
        s = row.stats
        cells = [pct(s["retrieval_by_length"].get(n), ".0f") for n in lengths]
        lines.append(f"| {row.name} | " + " | ".join(cells) +
                     f" | {pct(s['retrieval'], '.0f')} | {pct(s['retrieval_accuracy'], '.0f')} |")
    return "\n".join(lines)


def passkey_grid(rows):
    lines = []
    for row in rows:
        cells = defaultdict(dict)
        for p in row.case.get("passkey", []):
            cells[p["length"]][p["depth"]] = p["correct"]
        if not cells:
            continue
        depths = sorted({d for by_depth in cells.values() for d in by_depth})
        if not lines:
            lines.append("| row | length | " + " | ".join(f"depth {d:.0%}" for d in depths) + " |")
            lines.append("|---|---|" + "---|" * len(depths))
        for length in sorted(cells):
            marks = " | ".join("✓" if cells[length].get(d) else "✗" for d in depths)
            lines.append(f"| {row.name} | {length} | {marks} |")
    return "\n".join(lines)


def log_ratio_axis(ax, label):
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)


def plot_quality(rows, path):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    curves = defaultdict(list)
    for row in rows:
        if not is_full(row.case):
            curves[row.series].append(row.stats)
    metrics = [(lambda s: s["ppl"] and s["ppl"].value, "perplexity increase over full (%)", 100.0),
               (lambda s: s["passkey"], "passkey accuracy (%)", 100.0),
               (lambda s: s["f1"], "agreement with full: token F1", 1.0)]
    for ax, (metric, title, scale) in zip(axes, metrics):
        for name, points in sorted(curves.items()):
            pts = sorted((s["kept"], metric(s) * scale) for s in points if metric(s) is not None and s["kept"])
            if pts:
                ax.plot([100 * k for k, _ in pts], [v for _, v in pts], marker="o", label=name)
        log_ratio_axis(ax, "KV memory kept (% of full, log scale)")
        ax.set_xticks([5, 10, 20, 50, 100])
        ax.set_title(title)
    if curves:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_front(rows, front, path):
    """Every row's perplexity increase (with its interval) against its compression ratio, the front in red."""
    points = scored(rows)
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(11, 6.5))
    for row in points:
        s, on_front = row.stats, row in front
        color = "C3" if on_front else "0.6"
        kept = s["retrieval"] is None or s["retrieval"] >= GOAL_RETRIEVAL
        ax.errorbar(s["ratio"], 100 * s["ppl"].value, fmt="o", color=color, mfc=color if kept else "white",
                    yerr=[[100 * (s["ppl"].value - s["ppl"].low)], [100 * (s["ppl"].high - s["ppl"].value)]],
                    capsize=3, zorder=3 if on_front else 2)
    for i, row in enumerate(front):
        ax.annotate(row.name, (row.stats["ratio"], 100 * row.stats["ppl"].value), textcoords="offset points",
                    xytext=(6, 4 if i % 2 else -11), fontsize=8, color="C3",
                    bbox={"fc": "white", "ec": "none", "alpha": 0.7, "pad": 0.5})
    ax.plot([r.stats["ratio"] for r in front], [100 * r.stats["ppl"].value for r in front], color="C3",
            label="Pareto front (no row saves more for less)")
    left = min(r.stats["ratio"] for r in points) / 1.2
    right = max(1.5 * max(r.stats["ratio"] for r in points), 2 * GOAL_RATIO)
    bottom = min(-1.0, min(100 * r.stats["ppl"].low for r in points) * 1.3)
    top = max(2.0, max(100 * r.stats["ppl"].high for r in points) * 1.3)
    ax.fill_between([GOAL_RATIO, right], bottom, 100 * GOAL_INCREASE, color="C2", alpha=0.15,
                    label=f"goal: ≥{GOAL_RATIO:g}× for ≤{pct(GOAL_INCREASE, '+.0f')}")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:+g}%"))
    log_ratio_axis(ax, "compression ratio: KV memory of full / memory held (log scale)")
    ax.set_xticks([x for x in (1, 2, 5, 10, 20, 50, 100) if left <= x <= right])
    ax.set(xlim=(left, right), ylim=(bottom, top), ylabel="perplexity increase over full, 95% interval (symlog)")
    title = "quality against memory: every row, the front in red"
    ax.set_title(title + (f"; hollow: retrieval below {pct(GOAL_RETRIEVAL, '.0f')} of full's"
                          if any(r.stats["retrieval"] is not None for r in rows) else ""))
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_retrieval(full_row, chosen, path):
    """Accuracy against depth, one line per length: `full`, then each chosen row, side by side."""
    panels = [full_row] + [r for r in chosen if r.case.get("retrieval")]
    lengths = sorted({r["length"] for r in full_row.case["retrieval"]})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), sharey=True, squeeze=False)
    for ax, row in zip(axes[0], panels):
        cells = tally(row.case["retrieval"], lambda r: (r["length"], r["depth"]))
        for i, n in enumerate(lengths):
            depths = sorted(d for m, d in cells if m == n)
            wide = len(lengths) - i  # the first lengths drawn wider, so that lines on top of them leave them seen
            ax.plot([100 * d for d in depths], [100 * share(cells[n, d]) for d in depths], marker="o",
                    linewidth=1.5 * wide, markersize=3 + 2.5 * wide, color=f"C{i}", label=f"{n} tokens")
        ax.set_title(row.name if row is full_row else f"{row.name} ({row.stats['ratio']:.1f}×)", fontsize=10)
        ax.set_xlabel("depth of the answer in the prompt (%)")
        ax.set_ylim(-5, 105)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("retrieval accuracy (%)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_layers(rows, budget, path):
    rows = [r for r in rows if (is_full(r.case) or r.case["budget"] == budget)
            and r.case["memory"].get("longest_entries")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.6))
    im = ax.imshow([r.case["memory"]["longest_entries"] for r in rows], aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.name for r in rows])
    ax.set_xlabel("layer")
    ax.set_title(f"tokens each layer holds at the end of the longest prompt "
                 f"({rows[0].case['memory']['longest_prompt']} tokens), budget {budget}")
    fig.colorbar(im, ax=ax, label="tokens held")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_timing(run):
    t = run.get("timing")
    return None if t is None else (t["wall_seconds"], "shared" if t["shared_prefill"] else "not shared", t["prefills"])


def timing_section(runs, sources, before=None, before_source=None):
    """The wall time of each run that recorded it, and the comparison with --timing-before; '' if none."""
    timed = [(source, run_timing(run), run.get("commit")) for run, source in zip(runs, sources) if run_timing(run)]
    if not timed:
        return ""
    text = "**Wall time:** " + "; ".join(
        f"`{source}` {wall:,.1f} s, prefill {shared} ({prefills} prefills)"
        + (f", built from {commit}" if commit else "")
        for source, (wall, shared, prefills), commit in timed) + "."
    if before is not None:
        old, now = run_timing(before), sum(t[0] for _, t, _ in timed)
        text += (f" **Before and after:** {old[0]:,.1f} s in [`{before_source}`]({before_source}) (prefill "
                 f"{old[1]}, {old[2]} prefills) against {now:,.1f} s now ({sum(t[2] for _, t, _ in timed)} "
                 f"prefills): before / after = {old[0] / now:.2f}×.")
    return text


def method_section(full_row, backend):
    full, s = full_row.case, full_row.settings.get("agreement", {})
    documents = sorted({p["document"] for p in full.get("perplexity", [])})
    prefixes = sorted({p["prefix"] for p in full.get("perplexity", [])})
    tokens = sorted({p["tokens"] for p in full.get("perplexity", [])})
    full_ppl = ", ".join(f"{p['document']} @{p['prefix']}: {p['perplexity']:.2f}" for p in full.get("perplexity", []))
    lines = [] if not documents else [
        f"- **Perplexity increase**: exp(NLL − NLL of `full`) − 1 for each document and prefix length, where the\n"
        f"  prefix ({', '.join(map(str, prefixes))} tokens of {', '.join(documents)}) is prefilled and compressed\n"
        f"  and the next {', '.join(map(str, tokens))} tokens are scored one by one through the compressed cache. A\n"
        f"  row's value is the mean over documents at each prefix length; overall, the mean over documents of their\n"
        f"  mean over prefix lengths. `full`: {full_ppl}.",
        f"- **[95% CI]**: a percentile bootstrap over documents ({RESAMPLES:,} resamples, seed {SEED}). It rests on\n"
        f"  {len(documents)} documents: with so few it only brackets their spread (with two, it spans the two).",
    ]
    long_gen = full.get("long_generation", [])
    if long_gen:
        lines.append(
            f"- **Long generation**: a short prompt ({', '.join(map(str, sorted({g['prefix'] for g in long_gen})))}"
            f" tokens of each document), then {', '.join(map(str, sorted({g['tokens'] for g in long_gen})))} tokens\n"
            f"  scored one by one, so that eviction while decoding counts: the perplexity increase over `full`'s,\n"
            f"  with the same interval.")
    if full.get("retrieval"):
        lines.append(
            f"- **Retrieval**: {len(full['retrieval'])} prompts of `full` at lengths "
            f"{', '.join(map(str, sorted({r['length'] for r in full['retrieval']})))} and depths "
            f"{', '.join(f'{d:.0%}' for d in sorted({r['depth'] for r in full['retrieval']}))}; a row's accuracy\n"
            f"  as a share of `full`'s on the same prompts.")
    if full.get("passkey"):
        lines.append(
            f"- **Passkey accuracy**: a five-digit key at depths "
            f"{', '.join(f'{d:.0%}' for d in sorted({p['depth'] for p in full['passkey']}))} of filler texts of "
            f"{', '.join(map(str, sorted({p['length'] for p in full['passkey']})))} tokens; correct when the 8\n"
            f"  greedy tokens after the question contain it.")
    if full.get("agreement"):
        lines.append(
            f"- **Agreement**: {s.get('agreement_prompts')} instructions over a {s.get('agreement_context')}-token "
            f"passage of each\n  document (chat template), {s.get('agreement_tokens')} greedy tokens compared with "
            f"`full`'s answer: the leading\n  tokens equal (as a share of `full`'s answer), the share of answers "
            f"equal throughout, and bag-of-tokens F1.")
    lines.append("- **Compression ratio**: the KV bytes `full` would hold over the bytes held, summed over all layers "
                 "and all jobs\n  of the row, at each job's end (whole blocks, as the pool and `/metrics` count them; "
                 "a quantized block\n  at its share of the slot that packs it).")
    if backend == "cpu":
        lines.append("  `full` holds f32 entries on the CPU backend. CUDA holds bf16 ones, half the bytes, and a bf16 "
                     "slot packs half as\n  many int4 groups (3, against 6): there an int4 row saves half as much, "
                     "but for its entries still at full\n  precision (unsealed, or a prefill chunk), which halve like "
                     "`full`'s (the bf16 basis below).")
    return "\n".join(lines)


def header(runs, copies, args):
    report = runs[0]
    options = f" --layer-budget {args.layer_budget}"
    options += f" --notes {args.notes}" if args.notes else ""
    options += f" --timing-before {args.out}/timing-before.json" if args.timing_before else ""
    options += f" --retrieval-rows '{args.retrieval_rows}'" if args.retrieval_rows else ""
    commands = "\n".join(run["command"] for run in runs)
    return f"""# What each KV compression policy costs and saves

Measured by `strata eval` on {report['model']['name']} ({report['backend']} backend, {report['machine']['cpu']},
{report['machine']['hardware_threads']} hardware threads). Reproduce with:

```
{commands}
.venv/bin/python tools/eval_report.py {' '.join(args.out + '/' + c for c in copies)} --out {args.out}{options}
```

The raw results are in {', '.join(f'[`{c}`]({c})' for c in copies)}.
"""


def chosen_rows(rows, names):
    """The rows of --retrieval-rows, or by default the best rows at 5×, 10× and 20×."""
    if not names:
        best = [best_at(rows, saving) for saving in SAVINGS]
        return list(dict.fromkeys(r for r in best if r is not None and r.case.get("retrieval")))
    by_name = {r.name: r for r in rows}
    missing = [n for n in names.split(",") if n not in by_name]
    if missing:
        raise SystemExit(f"--retrieval-rows: no row named {', '.join(missing)}")
    return [by_name[n] for n in names.split(",")]


def retrieval_section(rows, chosen, out):
    """`full`'s accuracy per length and depth, every row's against it, and OUT/retrieval_by_depth.png; '' if
    no `full` measured retrieval."""
    fulls = [r for r in rows if is_full(r.case) and r.case.get("retrieval")]
    if not fulls:
        return ""
    text = "## Retrieval\n\n"
    for full_row in fulls:
        text += f"`{full_row.name}`'s accuracy per length and depth:\n\n{full_retrieval_table(full_row)}\n\n"
    plot_retrieval(fulls[0], chosen, os.path.join(out, "retrieval_by_depth.png"))
    return text + f"""Each row's accuracy as a share of its `full`'s, per length and overall (and its own accuracy):

{retrieval_table(rows)}

![retrieval by depth](retrieval_by_depth.png)
"""


def copy_inputs(args):
    """Copies the JSON beside the report; returns the copies' names and the --timing-before copy's name. An input
    already in the output folder keeps its name (the order of the inputs is their precedence, not their names);
    the others are named results.json, results-2.json, ... by position, which must not name another input there."""
    os.makedirs(args.out, exist_ok=True)
    inside = {path: os.path.dirname(os.path.abspath(path)) == os.path.abspath(args.out) for path in args.results}
    pairs = [(path, os.path.basename(path) if inside[path] else "results.json" if i == 0 else f"results-{i + 1}.json")
             for i, path in enumerate(args.results)]
    kept = {name for path, name in pairs if inside[path]}
    for path, name in pairs:
        if not inside[path] and name in kept:
            raise SystemExit(f"eval_report: copying {path} to {name} would overwrite another input")
    if args.timing_before:
        pairs.append((args.timing_before, "timing-before.json"))
    for path, name in pairs:
        if os.path.abspath(path) != os.path.abspath(os.path.join(args.out, name)):
            shutil.copyfile(path, os.path.join(args.out, name))
    return [name for _, name in pairs[:len(args.results)]], "timing-before.json" if args.timing_before else None


def load(path):
    with open(path) as f:
        return json.load(f)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="the JSON written by strata eval; several runs are merged")
    ap.add_argument("--out", default="docs/eval", help="folder for README.md, the plots and a copy of the JSON")
    ap.add_argument("--layer-budget", default="128", help="the budget of the per-layer occupancy picture")
    ap.add_argument("--notes", help="a markdown file of findings written by a person, placed after the method")
    ap.add_argument("--timing-before", metavar="FILE.json",
                    help="an earlier run's JSON with \"timing\": its wall time is compared with these results'")
    ap.add_argument("--retrieval-rows", metavar="ROW,ROW",
                    help="rows drawn beside full in retrieval_by_depth.png (default: the best at 5x, 10x, 20x)")
    return ap.parse_args(argv)


def sections(runs, copies, rows, args, timing, drawn):
    """The report's parts in order; `drawn` names the optional plots written."""
    front = pareto_front(rows)
    front_plot = "![the Pareto front](pareto_front.png)\n\n" if "pareto_front" in drawn else ""
    parts = [
        header(runs, copies, args),
        f"{timing}\n" if timing else "",
        method_section(next(r for r in rows if is_full(r.case)), runs[0]["backend"]) + "\n",
        open(args.notes).read().strip() + "\n" if args.notes else "",
    ]
    if scored(rows):  # the perplexity-based parts; a run of other tasks alone (RULER, say) has none
        parts += [
            f"## The goal\n\n{goal_section(rows)}\n",
            f"## Best measured configuration at {', '.join(f'{x}×' for x in SAVINGS)} less KV memory\n\n"
            f"{best_table(rows)}\n",
            f"## Quality against memory: the Pareto front\n\n{front_plot}"
            f"The rows on the front (no other row saves as much memory for less):\n\n{front_table(front)}\n",
            f"## Every row\n\n{row_table(rows)}\n\n![quality against memory kept](quality_vs_memory.png)\n",
        ]
    parts.append("## Memory as users pay it\n\nWhat `full` would hold over what the row held, summed over its jobs: at "
                 "their ends, and at their peaks (the most each sequence held at any step, its prompt's prefill "
                 "included: a policy that compresses at the prompt's end holds the whole prompt first). The f32 "
                 "basis compares with full-precision entries as the CPU path stores them; the bf16 basis with the "
                 "CUDA path's, where a quantized row saves half as much.\n\n" + memory_table(rows) + "\n")
    by_prefix = prefix_table(rows)
    if by_prefix:
        parts.append(f"## Perplexity increase per prefix length\n\n{by_prefix}\n")
    parts.append(retrieval_section(rows, chosen_rows(rows, args.retrieval_rows), args.out))
    peak_bf16 = lambda row: bf16_basis(row.case, "peak")  # noqa: E731
    end_bf16 = lambda row: bf16_basis(row.case, "end")  # noqa: E731
    full_ruler = [item for r in rows if is_full(r.case) for item in r.case.get("ruler", [])]
    parts.append(ruler_section(rows, full_ruler, "ruler_frontier.png" if "ruler" in drawn else None,
                               ruler_goal(rows, peak_bf16, perplexity_shortfalls),
                               savings_tables(rows, end_bf16, peak_bf16) if full_ruler else None))
    if "layers" in drawn:
        parts.append("## Per-layer occupancy\n\n![tokens held per layer](layer_occupancy.png)\n")
    grid = passkey_grid(rows)
    if grid:
        parts.append(f"## Passkey retrieval per cell\n\n{grid}\n")
    return [p for p in parts if p]


def main(argv=None):
    args = parse_args(argv)
    runs = [load(path) for path in args.results]
    before = load(args.timing_before) if args.timing_before else None
    if before is not None and (run_timing(before) is None or not any(map(run_timing, runs))):
        raise SystemExit(f"--timing-before: {args.timing_before} or the results have no \"timing\" to compare")
    copies, before_copy = copy_inputs(args)
    rows = collect_rows(runs, copies)
    if scored(rows):
        plot_quality(rows, os.path.join(args.out, "quality_vs_memory.png"))
    drawn = {name for name, path in [
        ("pareto_front", plot_front(rows, pareto_front(rows), os.path.join(args.out, "pareto_front.png"))),
        ("layers", plot_layers(rows, args.layer_budget, os.path.join(args.out, "layer_occupancy.png"))),
        ("ruler", plot_ruler(rows, os.path.join(args.out, "ruler_frontier.png")))] if path}
    timing = timing_section(runs, copies, before, before_copy)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("\n".join(sections(runs, copies, rows, args, timing, drawn)))
    print(f"wrote {args.out}/README.md")
    if timing:
        print(timing)


if __name__ == "__main__":
    main()
