"""What the benchmark scripts share: a free port, waiting for a server's /health, and the machine they ran on."""
import platform
import subprocess
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from listen_port import free_port  # noqa: E402,F401  (the benchmarks import it from here)


def wait_healthy(process, port, timeout_s):
    """Waits until the server answers /health with 200; RuntimeError if it exits or does not come up in time."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not come up within {timeout_s} s")


def start_serve(cmd, cwd, port, timeout_s):
    """Starts `strata serve` (cmd, its output discarded) and waits for /health; kills it if it does not come up."""
    process = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(process, port, timeout_s)
    except RuntimeError:
        process.kill()
        raise
    return process


def machine():
    """The CPU model, the cores this process may use and the kernel, for a result file."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "")
    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": cores, "kernel": platform.release()}
