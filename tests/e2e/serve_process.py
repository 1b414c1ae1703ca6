"""One `strata serve` of a test's own, with --set overrides (configs/smollm2-cpu.yaml otherwise), for the tests that
need a configuration the session's shared server does not have. Its output goes to a log file; log_tail() is what
a failing start-up shows."""
import os
import shutil
import tempfile
from pathlib import Path
import subprocess

import pytest

from support import MODEL, ROOT, free_port, stop_process, wait_until_ready

CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
STARTUP_TIMEOUT_S = 120
STARTED = []  # every ServeProcess of the session, in order: conftest attaches a failing test's servers' log tails


def strata_binary():
    path = Path(os.environ.get("STRATA_BIN", "build/strata"))
    return path if path.is_absolute() else ROOT / path


class ServeProcess:
    """command: "serve", or "route" (tests/e2e/test_router.py); port: a given one (a replica restarted where it
    was), or a free one."""

    def __init__(self, overrides=(), name="strata serve", extra_args=(), config=CONFIG, command="serve", port=None):
        if not strata_binary().exists() or not MODEL.exists():
            pytest.fail("build/strata or the model is missing: run tools/setup.sh")
        self.name = name
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_dir = Path(tempfile.mkdtemp(prefix="strata-e2e-"))
        self.log_path = self.log_dir / "serve.log"
        args = [str(strata_binary()), command, "--config", str(config), "--port", str(self.port), *extra_args]
        for o in overrides:
            args += ["--set", o]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.stopped_log = None  # the log's tail when stop() removed the file
        STARTED.append(self)

    def wait_ready(self, timeout_s=STARTUP_TIMEOUT_S):
        wait_until_ready(self.process, f"{self.base_url}/health", self.name, timeout_s, self.log_tail, 0.5)
        return self

    def log_tail(self, n=8000):
        if self.stopped_log is not None:
            return self.stopped_log[-n:]
        return self.log_path.read_bytes()[-n:].decode("utf-8", errors="replace")

    def stop(self, timeout_s=20):
        stop_process(self.process, timeout_s=timeout_s)
        self.stopped_log = self.log_tail()
        shutil.rmtree(self.log_dir, ignore_errors=True)
