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


def version_lines():
    result = subprocess.run([str(strata_binary()), "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def expected_cpu_kernels():
    """The level kernels/cpu/quantized_dot.cpp should pick, read from the kernel's own flags: x86-64-v4 needs
    AVX-512 F, BW, DQ and VL; x86-64-v3 AVX2, FMA, F16C, BMI1/2, MOVBE and LZCNT (abm in /proc/cpuinfo); the
    avx512_vnni level v4 and AVX-512 VNNI; the amx level that, and the AMX probe finding the tiles usable (whether
    Linux grants them and the VM runs them is the probe's to find: the third line of `strata --version`)."""
    flags = cpu_flags()
    v3 = {"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"} <= flags
    if v3 and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        if "avx512_vnni" not in flags:
            return "avx512"
        return "amx" if version_lines()[2].startswith("amx: usable ") else "avx512_vnni"
    return "avx2" if v3 else "baseline"


def expected_amx_states():
    """What the AMX probe (kernels/cpu/amx_probe.h) may say: absent where the kernel lists no amx_tile and amx_int8;
    where it does, whether Linux grants the tile state and the VM runs a tile product is the probe's to find."""
    if {"amx_tile", "amx_int8"} <= cpu_flags():
        return {"refused", "trapped", "usable"}
    return {"absent"}


def test_version_names_the_checked_out_commit_the_cpu_kernels_and_amx():
    lines = version_lines()
    assert lines[:2] == [f"strata {checkout_commit()}", f"cpu kernels: {expected_cpu_kernels()}"]
    assert len(lines) == 3 and lines[2].startswith("amx: "), lines
    state, _, reason = lines[2].removeprefix("amx: ").partition(" (")
    assert state in expected_amx_states() and reason.endswith(")") and len(reason) > 1, lines[2]


def test_metrics_label_the_build_with_its_commit_backend_cpu_kernels_and_amx(server):
    commit = version_lines()[0].removeprefix("strata ")
    amx = version_lines()[2].removeprefix("amx: ").partition(" (")[0]
    assert amx in expected_amx_states()
    assert metric(metrics(server.base_url), "strata_build_info", commit=commit, backend="cpu",
                  cpu_kernels=expected_cpu_kernels(), amx=amx) == 1


def test_an_eval_result_records_its_commit_and_activations(tmp_path):
    out = tmp_path / "results.json"
    result = subprocess.run([str(strata_binary()), "eval", "--config", str(CONFIG), "--out", str(out), *EVAL_TINY_TASK,
                             "--policies", "", "--quantized", ""], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["commit"] == version_lines()[0].removeprefix("strata ")
    assert report["activations"] == ("f32" if expected_cpu_kernels() == "baseline" else "int16")
