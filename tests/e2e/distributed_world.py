"""Helpers of the multi-rank tests: start `strata generate` or `strata serve` as a world of mpirun ranks on the CPU
(docs/distributed.md), or as one plain process, and read what `generate --json` prints.

Every world runs with one compute thread per rank and --oversubscribe (the test machine may have fewer cores than
ranks), and as root where CI runs as root.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

from support import ROOT

CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
WORLD_TIMEOUT_S = 240
# Small pools: the tests hold a few hundred tokens; every rank carves its own pool. fp32 activations: a world is
# held to one process at the fp32 path's tolerance, where only the order of sums differs. The default int16
# activations (from AVX2 up) round every matmul's input, so a reordered sum can put an activation on the other
# side of a rounding step and a world's log-probabilities move further (test_distributed.py checks that path at
# its own tolerance).
COMMON_SETTINGS = ("engine.threads=1", "kv_cache.memory_mib=48", "engine.activation_dtype=f32")


def strata_binary():
    path = Path(os.environ.get("STRATA_BIN", "build/strata"))
    return path if path.is_absolute() else ROOT / path


def world_env():
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    return env


def mpirun_prefix(n_ranks):
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is missing: tools/setup.sh installs Open MPI (openmpi-bin)"
    return [mpirun, "--oversubscribe", "-np", str(n_ranks)]


def command(subcommand, tp, pp, args, settings=()):
    """The command line of a world of tp * pp ranks; tp == pp == 1 is one plain process, without mpirun."""
    cmd = [str(strata_binary()), subcommand, "--config", str(CONFIG)]
    for setting in (*COMMON_SETTINGS, *settings):
        cmd += ["--set", setting]
    cmd += list(args)
    if tp * pp == 1:
        return cmd
    return mpirun_prefix(tp * pp) + cmd + ["--tp", str(tp), "--pp", str(pp)]


def run(subcommand, tp, pp, args, settings=(), timeout_s=WORLD_TIMEOUT_S):
    return subprocess.run(command(subcommand, tp, pp, args, settings), cwd=ROOT, env=world_env(),
                          capture_output=True, text=True, timeout=timeout_s)


def generate(tp, pp, args, settings=()):
    """`strata generate --json` in a world: one dict per generated token (token, logprob, top, layer_tokens)."""
    done = run("generate", tp, pp, ["--json", "--ignore-eos", *args], settings)
    assert done.returncode == 0, f"tp={tp} pp={pp} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
