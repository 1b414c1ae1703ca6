"""Connection limits of the real binary: past server.max_connections a new connection gets 503
(too_many_connections) and is closed while the others are served on; an idle keep-alive connection is closed after
server.idle_timeout_s; the soft descriptor limit is raised to the hard one at start-up, and a max_connections that
cannot fit under the hard limit stops the start-up with an error naming the key. The issue's scenario (descriptor
limit 1,024, 1,300 idle connections) now answers new requests at once and leaves no "accept failed" in the log."""
import resource
import socket
import subprocess
import time

import pytest
import requests

from serve_process import CONFIG, ServeProcess, strata_binary
from support import ROOT, error_of


def open_connection(port, request=True):
    """A connection the server has accepted and answered once (so it holds a slot), kept open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    if request:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "the connection was not served"
    return sock


def with_descriptor_limit(soft, hard):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connections_past_the_limit_get_503_and_the_others_are_served_on():
    server = ServeProcess(["server.max_connections=8"], name="strata serve, 8 connections").wait_ready()
    held = []
    try:
        # wait_ready's own connection may still be closing: fill up to the limit.
        for _ in range(8):
            held.append(open_connection(server.port))
        response = requests.get(f"{server.base_url}/v1/models", timeout=30)
        error = error_of(response, 503)
        assert error["code"] == "too_many_connections" and "8 connections" in error["message"], error
        assert response.headers["Retry-After"] == "1"
        assert response.headers["Connection"] == "close"
        held[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held[0].recv(4096).startswith(b"HTTP/1.1 200"), "a held connection is still served"
        held.pop().close()
        deadline = time.monotonic() + 10
        while requests.get(f"{server.base_url}/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "a closed connection's slot did not come back"
            time.sleep(0.1)
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_idle_keep_alive_connections_are_closed():
    server = ServeProcess(["server.idle_timeout_s=1"], name="strata serve, idle timeout 1 s").wait_ready()
    try:
        for request in (False, True):  # silent from the start, and idle after a first request
            sock = open_connection(server.port, request=request)
            started = time.monotonic()
            assert sock.recv(4096) == b"", "the server closes the idle connection"
            assert 0.5 < time.monotonic() - started < 10
            sock.close()
    finally:
        server.stop()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 2048:
        pytest.skip(f"needs a finite hard limit of at least 2048 (have {hard})")
    server = ServeProcess(name="strata serve, low soft limit")
    server.process.kill()  # ServeProcess has no preexec: start one of our own with the low soft limit
    server.process.wait()
    args = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", str(server.port)]
    with open(server.log_path, "wb") as log:
        server.process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=with_descriptor_limit(1024, hard))
    try:
        server.wait_ready()
        limits = open(f"/proc/{server.process.pid}/limits").read()
        line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)], line
    finally:
        server.stop()


def test_max_connections_that_cannot_fit_under_the_hard_limit_is_a_config_error():
    args = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", "0"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=with_descriptor_limit(256, 256))
    assert done.returncode == 1
    assert "smollm2-cpu.yaml: server.max_connections: 512 connections do not fit under the descriptor limit of 256" \
        in done.stderr, done.stderr


def test_the_issues_scenario_1300_idle_connections_under_a_limit_of_1024():
    server = ServeProcess(name="strata serve, 1024 descriptors")
    server.process.kill()
    server.process.wait()
    args = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", str(server.port)]
    with open(server.log_path, "wb") as log:
        server.process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=with_descriptor_limit(1024, 1024))
    idle = []
    try:
        server.wait_ready()
        for _ in range(1300):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
        started = time.monotonic()
        response = requests.get(f"{server.base_url}/health", timeout=30)
        assert time.monotonic() - started < 10, "a new request is answered, not left to time out"
        error_of(response, 503)  # 512 idle connections hold every slot
        for sock in idle:
            sock.close()
        idle.clear()
        deadline = time.monotonic() + 20
        while requests.get(f"{server.base_url}/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the slots did not come back"
            time.sleep(0.2)
        assert "accept failed" not in server.log_tail(10**7)
        assert server.process.poll() is None
    finally:
        for sock in idle:
            sock.close()
        server.stop()
