"""bench/cpu_vs_llamacpp.sh when llama.cpp dies ([cpu-xeon]): on a VM that reports AMX and traps its tile
instructions, llama.cpp's native build is killed by SIGILL on batched work. The script must go on, measure Strata,
and write its JSON naming each llama.cpp command that failed and how, with no ratio for those cases, rather than
stop with nothing written. The llama.cpp binaries here are programs that really die of SIGILL (the real ones run
on this machine), so every llama.cpp command fails."""
import json
import stat
import subprocess

from serve_process import strata_binary
from support import ROOT, free_port

CRASHING_BINARY = '#!/bin/sh\necho "{name}: illegal instruction, as on a VM that traps AMX" >&2\nkill -ILL $$\n'


def test_a_crashing_llamacpp_leaves_strata_measured_and_the_failures_named(tmp_path):
    bin_dir = tmp_path / "llamacpp" / "build-0.3.36" / "bin"  # where the script looks for a built llama.cpp
    bin_dir.mkdir(parents=True)
    for name in ("llama-bench", "llama-batched-bench", "llama-server"):
        path = bin_dir / name
        path.write_text(CRASHING_BINARY.format(name=name))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "result.json"
    run = subprocess.run(
        ["bench/cpu_vs_llamacpp.sh", "--llamacpp-dir", str(tmp_path / "llamacpp"), "--strata", str(strata_binary()),
         "-r", "1", "--prompt-tokens", "16", "--gen-tokens", "4", "--batch", "2", "--http-rounds", "1",
         "--llama-port", str(free_port()), "--strata-port", str(free_port()), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())

    failures = {f["kind"]: f for f in result["failures"]}
    assert set(failures) == {"probe", "batch1", "batch1-depth", "batch2", "http-server"}
    for f in failures.values():
        assert f["exit_status"] == 128 + 4 and "SIGILL" in f["how"], f
        assert any("illegal instruction" in line for line in f["stderr_tail"]), f
        assert any(f["command"] in w for w in result["warnings"]), f
    assert all(r is None for r in result["ratios_strata_over_llamacpp"].values())

    summary = result["summary"]
    for case in ("prefill_tokens_per_second", "batch1_decode_tokens_per_second", "batch2_decode_tokens_per_second",
                 "http_1_stream_tokens_per_second", "http_2_streams_tokens_per_second"):
        assert summary[case]["llama.cpp"] is None and summary[case]["strata"] > 0, case
