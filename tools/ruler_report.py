"""RULER's part of the eval report (tools/eval_report.py): scores per task and setting, each row against the `full` of
its file.

A task is scored as RULER scores it: the mean over its prompts of the share of expected values the answer recalls.
A row's RULER average in a setting is its mean score over the tasks where `full` scores at least RULER_FLOOR in that
setting, divided by `full`'s mean over the same tasks; a task below the floor measures the model, not the policy,
and is shown but left out.
"""
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RULER_FLOOR = 0.5
SETTINGS = ("in_prompt", "after_compression")
# [eval-ruler]'s goal: at least this much less KV memory at the peak, on the bf16 basis, with at least GOAL_RULER of
# `full`'s RULER average in both settings (and the perplexity terms of the report's own goal).
GOAL_PEAK, GOAL_RULER = 10.0, 0.95
# The savings the report gathers rows around (the "about 5x and 10x"): a row is about T when its saving on
# the bf16 basis lies within a factor of sqrt(2) of T.
SAVINGS_TARGETS = (5.0, 10.0)


def ruler_scores(items):
    """{(task, setting): mean recall} over a row's RULER results."""
    cells = defaultdict(list)
    for r in items:
        cells[r["task"], r["setting"]].append(r["recall"])
    return {key: sum(v) / len(v) for key, v in cells.items()}


def counted_tasks(full_scores, setting):
    """The tasks of a setting that enter the averages: those where `full` reaches the floor."""
    return sorted(t for (t, s), v in full_scores.items() if s == setting and v >= RULER_FLOOR)


def relative_ruler(items, full_items):
    """{setting: the row's average over full's} on the counted tasks; a setting without any is left out."""
    mine, full = ruler_scores(items), ruler_scores(full_items)
    out = {}
    for setting in sorted({s for _, s in full}):
        tasks = [t for t in counted_tasks(full, setting) if (t, setting) in mine]
        reference = sum(full[t, setting] for t in tasks)
        if tasks and reference > 0:
            out[setting] = sum(mine[t, setting] for t in tasks) / reference
    return out


def _pct(x):
    return "–" if x is None else f"{100 * x:.0f}%"


def full_table(full_items):
    """`full`'s score per task (rows) at each length and setting (columns), from every file's `full` (a case two files
    hold counts once), and where it falls below the floor: there the task is left out of the averages of the rows
    measured at that length."""
    cells = defaultdict(list)
    for item in {(i["task"], i["length"], i["trial"], i["setting"]): i for i in full_items}.values():
        cells[item["task"], item["length"], item["setting"]].append(item["recall"])
    score = {key: sum(v) / len(v) for key, v in cells.items()}
    columns = sorted({(n, s) for _, n, s in score}, key=lambda c: (c[0], SETTINGS.index(c[1])))
    lines = ["| task | " + " | ".join(f"{n:,}, {s}" for n, s in columns) + " | `full` below " +
             f"{RULER_FLOOR:.0%} at |", "|---|" + "---|" * (len(columns) + 1)]
    for t in sorted({t for t, _, _ in score}):
        below = [f"{n:,} {s}" for n, s in columns if score.get((t, n, s), 1.0) < RULER_FLOOR]
        lines.append(f"| {t} | " + " | ".join(_pct(score.get((t, n, s))) for n, s in columns) +
                     f" | {', '.join(below) or '–'} |")
    return "\n".join(lines)


def rows_table(rows, setting):
    """Every row's score per task in one setting, and its average as a share of `full`'s."""
    scores = {row.name: ruler_scores(row.case.get("ruler", [])) for row in rows}
    tasks = sorted({t for s in scores.values() for t, x in s if x == setting})
    lines = ["| row | memory saved | " + " | ".join(tasks) + " | average (% of full's) |",
             "|---|---|" + "---|" * (len(tasks) + 1)]
    for row in rows:
        s = scores[row.name]
        if not any(x == setting for _, x in s):
            continue
        ratio = row.stats.get("ratio")
        cells = [_pct(s.get((t, setting))) for t in tasks]
        lines.append(f"| {row.name} | {ratio:.1f}× | " + " | ".join(cells) +
                     f" | {_pct(row.stats.get('ruler', {}).get(setting))} |")
    return "\n".join(lines)


UNQUANTIZED = ("f32", "f16", "bf16")


def is_full(case):
    """The reference row: `full` on an unquantized pool (f32, or the 16-bit formats of kv_cache.dtype)."""
    return case.get("policy") == "full" and not case.get("budget") and case.get("kv_dtype", "f32") in UNQUANTIZED


def savings_tables(rows, end_bf16, peak_bf16):
    """For each target saving, at the rows' ends and at their peaks (bf16 basis): the rows about that saving, with
    their score per task and setting on the tasks that enter the averages, and their averages."""
    full = max((r for r in rows if is_full(r.case)), key=lambda r: len(r.case.get("ruler", [])))  # the most measured
    full_scores = ruler_scores(full.case["ruler"])
    columns = [(t, s) for s in SETTINGS for t in counted_tasks(full_scores, s)]
    parts = []
    for target in SAVINGS_TARGETS:
        for where, saving in (("its end", end_bf16), ("its peak", peak_bf16)):
            members = [r for r in rows if not is_full(r.case) and r.case.get("ruler") and saving(r) is not None
                       and target / 2 ** 0.5 <= saving(r) < target * 2 ** 0.5]
            if not members:
                parts.append(f"**About {target:g}× less at {where}:** no row.\n")
                continue
            lines = ["| row | at its end | at its peak | " + " | ".join(f"{t}, {s}" for t, s in columns) +
                     " | " + " | ".join(f"average, {s} (% of full's)" for s in SETTINGS) + " |",
                     "|---|---|---|" + "---|" * (len(columns) + len(SETTINGS))]
            for r in sorted(members, key=saving):
                scores = ruler_scores(r.case["ruler"])
                cells = [_pct(scores.get(c)) for c in columns]
                cells += [_pct(r.stats.get("ruler", {}).get(s)) for s in SETTINGS]
                savings = [f"{x:.1f}×" if x is not None else "–" for x in (end_bf16(r), peak_bf16(r))]
                lines.append(f"| {r.name} | " + " | ".join(savings + cells) + " |")
            parts.append(f"**About {target:g}× less at {where}** (bf16 basis):\n\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


def plot_ruler(rows, path):
    """One panel per setting: each row's RULER average (% of `full`'s) against the memory it saved at its peak and
    at its end; a line joins the rows of one policy. None when no row has a RULER average."""
    measured = [r for r in rows if r.stats.get("ruler")]
    if not measured:
        return None
    fig, axes = plt.subplots(1, len(SETTINGS), figsize=(13, 5.5), sharey=True)
    for ax, setting in zip(axes, SETTINGS):
        series = defaultdict(list)
        for row in measured:
            if setting in row.stats["ruler"]:
                series[row.series].append(row)
        for i, (name, members) in enumerate(sorted(series.items())):
            members.sort(key=lambda r: r.stats["ratio"])
            ys = [100 * r.stats["ruler"][setting] for r in members]
            ax.plot([r.stats["ratio"] for r in members], ys, "o-", color=f"C{i}", label=f"{name}, at the end")
            peaks = [r.stats.get("peak_ratio") for r in members]
            if all(p is not None for p in peaks):
                ax.plot(peaks, ys, "s--", color=f"C{i}", mfc="white", label=f"{name}, at the peak")
        ax.axhline(100 * 0.95, color="C2", lw=1, ls=":", label="95% of full's")
        ax.set_xscale("log")
        ax.set(xlabel="memory saved: KV bytes of full / bytes held (log)", title=setting)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("RULER average, % of full's (tasks full passes)")
    axes[-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ruler_shortfalls(row, peak_bf16, perplexity_shortfalls):
    """What keeps a row from the goal, with its numbers; empty when it meets every term."""
    peak, misses = peak_bf16(row), []
    if peak is None:
        misses.append("its peak not measured")
    elif peak < GOAL_PEAK:
        misses.append(f"{peak:.2f}× less at its peak (bf16 basis) < {GOAL_PEAK:g}×")
    for setting in SETTINGS:
        score = row.stats.get("ruler", {}).get(setting)
        if score is None:
            misses.append(f"RULER {setting} not measured")
        elif score < GOAL_RULER:
            misses.append(f"RULER {setting} {_pct(score)} of full's < {_pct(GOAL_RULER)}")
    return misses + perplexity_shortfalls(row)


def ruler_goal(rows, peak_bf16, perplexity_shortfalls):
    """Whether a row reaches the goal; if none does, the three that come closest (fewest terms missed, then the
    most memory saved at the peak) and what stands in their way."""
    candidates = [(ruler_shortfalls(r, peak_bf16, perplexity_shortfalls), r) for r in rows if not is_full(r.case)]
    reached = [r for misses, r in candidates if not misses]
    goal = (f"**Goal:** at least {GOAL_PEAK:g}× less KV memory at the peak on the bf16 basis, at least "
            f"{_pct(GOAL_RULER)} of `full`'s RULER average in both settings, and the perplexity terms above.")
    if reached:
        return goal + "\n\n**Reached** by " + ", ".join(f"**{r.name}**" for r in reached) + "."
    closest = sorted(candidates, key=lambda c: (len(c[0]), -(peak_bf16(c[1]) or 0.0)))[:3]
    lines = [goal, "", "**Not reached.** The rows that come closest:", ""]
    lines += [f"- **{r.name}**. In the way: {'; '.join(misses)}." for misses, r in closest]
    return "\n".join(lines)


def ruler_section(rows, full_items, plot=None, goal=None, savings=None):
    """The report's RULER section; empty when `full` did not measure RULER. full_items: the RULER results of every
    file's `full`. `savings`: savings_tables' text."""
    if not full_items:
        return ""
    parts = ["## RULER: the question in the prompt, and after compression\n",
             "Seven of RULER's synthetic task families (Hsieh et al., 2024; `eval/ruler_tasks.h`), scored as RULER "
             "scores them: the share of the expected values the greedy answer holds. *in_prompt*: the question ends "
             "the prompt, so a question-aware policy sees it when it compresses. *after_compression*: the context "
             "alone is prefilled and compressed, and the question follows as a continuation (a chat's next turn, a "
             f"new question about a cached document). A task where `full` scores below {RULER_FLOOR:.0%} (over the "
             "lengths of a row's file) is shown but left out of that row's averages.\n",
             full_table(full_items) + "\n"]
    if goal:
        parts.append(goal + "\n")
    if savings:
        parts.append("### About 5× and 10× less memory\n\nThe rows whose saving on the bf16 basis lies within a "
                     "factor of √2 of 5× and of 10×, at their jobs' ends and at their peaks; the tasks that enter "
                     "the averages, in both settings.\n\n" + savings)
    if plot:
        parts.append(f"![RULER against memory, per setting]({plot})\n")
    for setting in SETTINGS:
        table = rows_table(rows, setting)
        if table.count("\n") > 1:
            parts.append(f"### {setting}\n\n{table}\n")
    return "\n".join(parts)
