"""Black-box tests of the shipped binary: one `strata serve` for the whole session, driven over HTTP with the official
openai client and raw requests (shared/style.md, section 4).

    .venv/bin/python -m pytest tests/e2e        # STRATA_BIN overrides build/strata

The server's output goes to a log file whose tail is attached to every failing test's report, beside the tails of
the test's own servers (serve_process.ServeProcess).
"""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import openai
import pytest
import requests

import serve_process
from support import MODEL, ROOT, free_port, stop_process, wait_until_ready

CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
STARTUP_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 240
TEST_TIMEOUT_S = 300
LOG_TAIL_BYTES = 8000


class Server:
    def __init__(self, process, port, log_path):
        self.process = process
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"

    def log_tail(self):
        data = self.log_path.read_bytes()
        return data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")

    def assert_alive(self):
        assert self.process.poll() is None, f"strata exited with {self.process.returncode}:\n{self.log_tail()}"


_server = None  # for the report hook, which cannot take fixtures


def _strata_binary():
    path = Path(os.environ.get("STRATA_BIN", "build/strata"))
    return path if path.is_absolute() else ROOT / path


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


def pytest_runtest_setup(item):
    item.first_own_server = len(serve_process.STARTED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    if _server is not None:
        report.sections.append(("shared strata serve log (tail)", _server.log_tail()))
    # The test's own servers: those it started, and those of its module's fixtures still running.
    first = getattr(item, "first_own_server", len(serve_process.STARTED))
    for i, own in enumerate(serve_process.STARTED):
        if i >= first or own.stopped_log is None:
            report.sections.append((f"{own.name} log (tail, port {own.port})", own.log_tail()))


@pytest.fixture(scope="session")
def server():
    global _server
    binary = _strata_binary()
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run tools/setup.sh to build it (or point STRATA_BIN at a strata binary)")
    if not MODEL.exists():
        pytest.fail(f"model file {MODEL} is missing: run tools/setup.sh to fetch it")
    port = free_port()
    log_path = Path(tempfile.mkdtemp(prefix="strata-e2e-")) / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(binary), "serve", "--config", str(CONFIG), "--port", str(port)],
                                   cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    _server = Server(process, port, log_path)
    try:
        wait_until_ready(process, f"{_server.base_url}/health", "strata serve", STARTUP_TIMEOUT_S, _server.log_tail,
                         interval_s=0.5)
        yield _server
    finally:
        stop_process(process, timeout_s=20)
        shutil.rmtree(log_path.parent, ignore_errors=True)
        _server = None


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=REQUEST_TIMEOUT_S)


@pytest.fixture(scope="session")
def model_name(server):
    response = requests.get(f"{server.base_url}/v1/models", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["data"][0]["id"]
