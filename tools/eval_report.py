#!/usr/bin/env python3
"""Turns the JSON of `strata eval` into a markdown report and PNG plots.

    .venv/bin/python tools/eval_report.py RESULTS.json --out docs/eval

writes OUT/README.md (the findings of --notes, the policy x budget table, the passkey grid, the per-layer occupancy) and OUT/*.png.
Every number in the report is computed here from the raw results, which are copied beside it.
"""
import argparse
import json
import math
import os
import shutil
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def label(case):
    name = case["policy"] + ("+" + case["kv_dtype"] if case["kv_dtype"] != "f32" else "")
    return name


def budget_key(budget):
    """Token budgets first (ascending), then fractions (ascending)."""
    if budget.endswith("%"):
        return (1, float(budget[:-1]))
    return (0, float(budget)) if budget else (-1, 0.0)


def summarize(case, full):
    """The row of one case: perplexity increase, passkey accuracy, agreement, memory."""
    ref = {(p["document"], p["prefix"]): p["mean_nll"] for p in full.get("perplexity", [])}
    deltas = [math.exp(p["mean_nll"] - ref[(p["document"], p["prefix"])]) - 1.0
              for p in case.get("perplexity", []) if (p["document"], p["prefix"]) in ref]
    passkey = case.get("passkey", [])
    agreement = case.get("agreement", [])
    return {
        "ppl_increase": sum(deltas) / len(deltas) if deltas else None,
        "ppl": [p["perplexity"] for p in case.get("perplexity", [])],
        "passkey": sum(p["correct"] for p in passkey) / len(passkey) if passkey else None,
        "prefix": (sum(a["common_prefix"] / max(1, a["compared"]) for a in agreement) / len(agreement)
                   if agreement else None),
        "exact": (sum(a["common_prefix"] == a["compared"] for a in agreement) / len(agreement)
                  if agreement else None),
        "f1": sum(a["token_f1"] for a in agreement) / len(agreement) if agreement else None,
        "ratio": case["memory"]["ratio"],
        "kept": 1.0 / case["memory"]["ratio"] if case["memory"]["ratio"] else None,
    }


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def table(results, full):
    lines = [
        "| policy | budget | perplexity increase | passkey accuracy | agreement: common prefix | "
        "agreement: all tokens equal | agreement: token F1 | compression ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in results:
        s = summarize(case, full)
        lines.append(
            f"| {label(case)} | {case['budget'] or '–'} | {fmt(100 * s['ppl_increase'] if s['ppl_increase'] is not None else None, '+.2f')}% "
            f"| {fmt(s['passkey'], '.0%')} | {fmt(s['prefix'], '.0%')} | {fmt(s['exact'], '.0%')} "
            f"| {fmt(s['f1'], '.2f')} | {fmt(s['ratio'], '.2f')}× |")
    return "\n".join(lines)


def passkey_grid(results):
    lines = []
    for case in results:
        cells = defaultdict(dict)
        for p in case.get("passkey", []):
            cells[p["length"]][p["depth"]] = p["correct"]
        if not cells:
            continue
        depths = sorted({d for row in cells.values() for d in row})
        if not lines:
            lines.append("| policy | budget | length | " + " | ".join(f"depth {d:.0%}" for d in depths) + " |")
            lines.append("|---|---|---|" + "---|" * len(depths))
        for length in sorted(cells):
            marks = " | ".join("✓" if cells[length].get(d) else "✗" for d in depths)
            lines.append(f"| {label(case)} | {case['budget'] or '–'} | {length} | {marks} |")
    return "\n".join(lines)


def plot_quality(results, full, path):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    curves = defaultdict(list)
    for case in results:
        if case["policy"] == "full":
            continue
        s = summarize(case, full)
        curves[label(case)].append((s["kept"], s))
    metrics = [("ppl_increase", "perplexity increase over full (%)", 100.0),
               ("passkey", "passkey accuracy (%)", 100.0),
               ("f1", "agreement with full: token F1", 1.0)]
    for ax, (key, title, scale) in zip(axes, metrics):
        for name, points in sorted(curves.items()):
            pts = sorted((k, s[key] * scale) for k, s in points if s[key] is not None and k is not None)
            if pts:
                ax.plot([100 * k for k, _ in pts], [v for _, v in pts], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xticks([5, 10, 20, 50, 100])
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("KV memory kept (% of full, log scale)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_layers(results, budget, path):
    rows = [c for c in results if c["policy"] == "full" or c["budget"] == budget]
    rows = [c for c in rows if c["memory"].get("longest_entries")]
    if not rows:
        return None
    data = [c["memory"]["longest_entries"] for c in rows]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.6))
    im = ax.imshow(data, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label(c) + ("" if c["policy"] == "full" else f" @{c['budget']}") for c in rows])
    ax.set_xlabel("layer")
    ax.set_title(f"tokens each layer holds at the end of the longest prompt ({rows[0]['memory']['longest_prompt']} "
                 f"tokens), budget {budget}")
    fig.colorbar(im, ax=ax, label="tokens held")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+",
                    help="the JSON written by strata eval; several runs (say, a policy added later) are merged, "
                         "`full` taken from the first")
    ap.add_argument("--out", default="docs/eval", help="folder for README.md, the plots and a copy of the JSON")
    ap.add_argument("--layer-budget", default="128", help="the budget of the per-layer occupancy picture")
    ap.add_argument("--notes", help="a markdown file of findings written by a person, placed after the method")
    args = ap.parse_args()

    runs = []
    for path in args.results:
        with open(path) as f:
            runs.append(json.load(f))
    report = runs[0]
    full = next(c for c in report["cases"] if c["policy"] == "full")
    merged = []
    for run in runs:  # a later run's case replaces an earlier one's
        for c in run["cases"]:
            if c["policy"] != "full":
                merged = [m for m in merged if (m["policy"], m["budget"], m["kv_dtype"]) !=
                          (c["policy"], c["budget"], c["kv_dtype"])] + [c]
    cases = [full] + sorted(merged, key=lambda c: (label(c), budget_key(c["budget"])))
    os.makedirs(args.out, exist_ok=True)
    copies = []
    for i, path in enumerate(args.results):
        name = "results.json" if i == 0 else f"results-{i + 1}.json"
        if os.path.abspath(path) != os.path.abspath(os.path.join(args.out, name)):
            shutil.copyfile(path, os.path.join(args.out, name))
        copies.append(name)
    plot_quality(cases, full, os.path.join(args.out, "quality_vs_memory.png"))
    layers = plot_layers(cases, args.layer_budget, os.path.join(args.out, "layer_occupancy.png"))

    s = report["settings"]
    full_ppl = ", ".join(f"{p['document']} @{p['prefix']}: {p['perplexity']:.2f}" for p in full.get("perplexity", []))
    text = f"""# What each KV compression policy costs and saves

Measured by `strata eval` on {report['model']['name']} ({report['backend']} backend, {report['machine']['cpu']},
{report['machine']['hardware_threads']} hardware threads). Reproduce with:

```
{chr(10).join(run['command'] for run in runs)}
.venv/bin/python tools/eval_report.py {' '.join(args.out + '/' + c for c in copies)} --out {args.out} --layer-budget {args.layer_budget}{' --notes ' + args.notes if args.notes else ''}
```

The raw results are in {', '.join(f'[`{c}`]({c})' for c in copies)}.

- **Perplexity increase**: the mean over documents and prefix lengths of exp(NLL − NLL of `full`) − 1, where the
  prefix ({', '.join(map(str, s['perplexity_prefixes']))} tokens of {', '.join(s['documents'])}) is prefilled and
  compressed and the next {s['perplexity_tokens']} tokens are scored one by one through the compressed cache.
  `full`: {full_ppl}.
- **Passkey accuracy**: a five-digit key at depths {', '.join(f'{d:.0%}' for d in s['passkey_depths'])} of
  filler texts of {', '.join(map(str, s['passkey_lengths']))} tokens; correct when the 8 greedy tokens after the
  question contain it.
- **Agreement**: {s['agreement_prompts']} instructions over a {s['agreement_context']}-token passage of each
  document (chat template), {s['agreement_tokens']} greedy tokens compared with `full`'s answer: the leading
  tokens equal (as a share of `full`'s answer), the share of answers equal throughout, and bag-of-tokens F1.
- **Compression ratio**: the KV bytes `full` would hold over the bytes held, summed over all layers and all jobs
  of the row, at each job's end (whole blocks, as the pool and `/metrics` count them).

{open(args.notes).read().strip() + chr(10) + chr(10) if args.notes else ""}## Policy × budget

{table(cases, full)}

![quality against memory kept](quality_vs_memory.png)

"""
    if layers:
        text += f"""## Per-layer occupancy

![tokens held per layer](layer_occupancy.png)

"""
    grid = passkey_grid(cases)
    if grid:
        text += f"""## Passkey retrieval per cell

{grid}
"""
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(text)
    print(f"wrote {args.out}/README.md")


if __name__ == "__main__":
    main()
