"""The commit a binary was built from (daemon/build_commit.h): git's own answer for the checkout, and the same
string from `strata --version`, /metrics and the JSON of `strata eval`, so that a result file names its code."""
import json
import subprocess

from serve_process import CONFIG, strata_binary
from support import EVAL_TINY_TASK, ROOT, metric, metrics


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def checkout_commit():
    """What the build should have recorded, asked of git: HEAD's short hash, "-dirty" where tracked files differ."""
    dirty = git("status", "--porcelain", "--untracked-files=no") != ""
    return git("rev-parse", "--short=7", "HEAD") + ("-dirty" if dirty else "")


def version():
    result = subprocess.run([str(strata_binary()), "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_version_names_the_checked_out_commit():
    assert version() == f"strata {checkout_commit()}"


def test_metrics_label_the_build_with_its_commit_and_backend(server):
    commit = version().removeprefix("strata ")
    assert metric(metrics(server.base_url), "strata_build_info", commit=commit, backend="cpu") == 1


def test_an_eval_result_records_its_commit(tmp_path):
    out = tmp_path / "results.json"
    result = subprocess.run([str(strata_binary()), "eval", "--config", str(CONFIG), "--out", str(out), *EVAL_TINY_TASK,
                             "--policies", "", "--quantized", ""], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(out.read_text(encoding="utf-8"))["commit"] == version().removeprefix("strata ")
