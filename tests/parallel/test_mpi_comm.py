"""Runs the MpiComm tests of parallel_tests between three real mpirun ranks (alone, as ctest runs them, they
skip). STRATA_BUILD_DIR: the CMake build (default build/)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("STRATA_BUILD_DIR", ROOT / "build"))


def test_mpi_comm_between_three_ranks():
    binary = BUILD / "tests" / "parallel_tests"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build first (tools/setup.sh, or set STRATA_BUILD_DIR)")
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is missing: tools/setup.sh installs Open MPI"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    done = subprocess.run([mpirun, "--oversubscribe", "-np", "3", str(binary), "--gtest_filter=MpiComm*",
                           "--gtest_color=no"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.count("[  PASSED  ] 4 tests.") == 3, done.stdout[-4000:]
    assert "SKIPPED" not in done.stdout, done.stdout[-4000:]
