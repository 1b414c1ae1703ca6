"""tools/eval_report.py on the committed results: one table row per case, the numbers recomputed from the raw
scores, and both plots written."""
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "eval" / "results.json"


def test_report_recomputes_the_committed_results(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "tools" / "eval_report.py"), str(RESULTS), "--out", str(tmp_path),
                    "--layer-budget", "64"], check=True, capture_output=True)
    text = (tmp_path / "README.md").read_text()
    report = json.loads(RESULTS.read_text())
    rows = [line for line in text.splitlines() if line.startswith("| ") and "×" in line]
    assert len(rows) == len(report["cases"])
    assert (tmp_path / "quality_vs_memory.png").stat().st_size > 10_000
    assert (tmp_path / "layer_occupancy.png").stat().st_size > 10_000

    # The perplexity increase of one row, from the raw mean NLLs.
    full = next(c for c in report["cases"] if c["policy"] == "full")
    case = next(c for c in report["cases"] if c["policy"] == "snapkv" and c["budget"] == "64")
    ref = {(p["document"], p["prefix"]): p["mean_nll"] for p in full["perplexity"]}
    inc = [math.exp(p["mean_nll"] - ref[(p["document"], p["prefix"])]) - 1 for p in case["perplexity"]]
    expected = f"{100 * sum(inc) / len(inc):+.2f}%"
    row = next(r for r in rows if r.startswith("| snapkv | 64 |"))
    assert expected in row
    # And the compression ratio is the bytes over the layers, as recorded.
    mem = case["memory"]
    assert f"{sum(mem['uncompressed_bytes']) / sum(mem['bytes']):.2f}×" in row
