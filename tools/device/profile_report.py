#!/usr/bin/env python3
"""The profile stage's kernel times, added to its bench report (tools/device/gpu_run.sh profile).

  profile_report.py ncu  NCU.csv  REPORT.json [KEY]   ncu --csv --page raw --metrics gpu__time_duration.sum
  profile_report.py nsys TRACE.csv REPORT.json [KEY]  nsys stats --report cuda_gpu_trace --format csv

The result goes under REPORT's key KEY ("profile" unless given), so one report can hold several profiles.

Both split the kernels into forward passes, each starting at an embedding_kernel, and give per pass the kernel
count, the kernels' time, the ten costliest kernels by name, and the ten costliest launch shapes (name and grid:
the matrix products of one kernel apart) with their launch counts. nsys's trace has start times too, so its passes
also say how long each took from its first kernel's start to its last kernel's end, and how much of that no kernel
ran (the host between kernels): whether the kernels or the host set a decode step's time.
"""
import collections
import csv
import json
import sys


def number(text):
    """A CSV cell as a float ('1,234.5' included), or None."""
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def short_name(name):
    """A kernel's name without its parameters and return type: 'void ns::k<4>(float*)' -> 'ns::k<4>'."""
    name = name.split("(")[0].strip()
    return name.split(" ")[-1][:80]


def split_passes(kernels):
    """kernels: (name, grid, start_ns or None, duration_ns) in launch order -> one dict per forward pass."""
    passes, current = [], None
    for name, grid, start, duration in kernels:
        if "embedding_kernel" in name or current is None:
            current = {"kernels": 0, "gpu_seconds": 0.0, "by_kernel": collections.Counter(),
                       "by_launch": collections.Counter(), "launches": collections.Counter(), "first": start,
                       "end": None}
            passes.append(current)
        current["kernels"] += 1
        current["gpu_seconds"] += duration * 1e-9
        current["by_kernel"][short_name(name)] += duration * 1e-9
        launch = f"{short_name(name)} grid {grid}"
        current["by_launch"][launch] += duration * 1e-9
        current["launches"][launch] += 1
        if start is not None:
            current["end"] = max(current["end"] or 0.0, start + duration)
    out = []
    for p in passes:
        entry = {"kernels": p["kernels"], "gpu_seconds": p["gpu_seconds"], "top": p["by_kernel"].most_common(10),
                 "top_launches": [[launch, seconds, p["launches"][launch]]
                                  for launch, seconds in p["by_launch"].most_common(10)]}
        if p["first"] is not None:
            entry["span_seconds"] = (p["end"] - p["first"]) * 1e-9
            entry["idle_seconds"] = entry["span_seconds"] - p["gpu_seconds"]
        out.append(entry)
    return out


def ncu_kernels(path):
    lines = [line for line in open(path, errors="replace") if line.startswith('"')]
    for row in csv.DictReader(lines):
        duration = number(row.get("gpu__time_duration.sum", ""))
        if duration is not None:  # not the units row
            yield row.get("Kernel Name", ""), row.get("Grid Size", "").replace(" ", ""), None, duration


def nsys_kernels(path):
    lines = [line for line in open(path, errors="replace") if "," in line]
    for row in csv.DictReader(lines):
        start, duration = number(row.get("Start (ns)", "")), number(row.get("Duration (ns)", ""))
        # The trace holds memory copies and sets too; kernels are the rows with a grid.
        if start is not None and duration is not None and row.get("GrdX", "").strip():
            grid = "(" + ",".join(row.get(k, "").strip() for k in ("GrdX", "GrdY", "GrdZ")) + ")"
            yield row.get("Name", ""), grid, start, duration


def main():
    tool, source, report_path = sys.argv[1:4]
    key = sys.argv[4] if len(sys.argv) > 4 else "profile"
    kernels = list(ncu_kernels(source) if tool == "ncu" else nsys_kernels(source))
    if not kernels:
        sys.exit(f"profile_report.py: no kernel in {source}")
    metric = {"ncu": "ncu gpu__time_duration.sum, every kernel, one pass",
              "nsys": "nsys cuda_gpu_trace: every kernel's start and duration"}[tool]
    report = json.load(open(report_path))
    report[key] = {"tool": tool, "metric": metric, "kernels": len(kernels), "passes": split_passes(kernels)}
    json.dump(report, open(report_path, "w"), indent=1)


if __name__ == "__main__":
    main()
