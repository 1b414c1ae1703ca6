"""The `serve` stage of gpu_run.sh: one `strata serve` on the GPU answers a chat request and a streamed completion,
each with a compression policy of its own, and its /metrics then shows a KV series per layer. Standard library
only (the GPU image has no `requests` guarantee); prints a JSON report and exits 1 if a check failed.
  python3 serve_check.py STRATA_BINARY PORT [--set KEY=VALUE ...]
strata gets STRATA_LIBRARY_PATH as its LD_LIBRARY_PATH (the carried libraries, which python3 must not load)."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

STARTUP_S = 120
REQUEST_S = 60


class RequestFailed(Exception):
    """An answer with a 4xx or 5xx status; the message holds its body."""


def post(base, path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:  # a 4xx or 5xx: its body says why
        raise RequestFailed(f"{path}: HTTP {error.code}: {error.read().decode()[:500]}") from None


def wait_ready(process, base):
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"strata serve exited with {process.returncode} during start-up")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"strata serve was not ready after {STARTUP_S} s")


def chat(base, report):
    status, text = post(base, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": ("Write a short poem about the sea, the wind and the boats that sail on it at night. Mention the "
                                                                  "lighthouse, the stars, the gulls, the fishermen and the harbour town "
                                                                  "that waits for them at dawn.")}], "max_tokens": 32,
        "kv_compression": {"policy": "snapkv", "budget": 40}})
    reply = json.loads(text)
    content = reply["choices"][0]["message"]["content"]
    report["chat"] = {"status": status, "content": content, "usage": reply.get("usage")}
    return status == 200 and bool(content)


def streamed_completion(base, report):
    status, text = post(base, "/v1/completions", {
        "prompt": "Once upon a time, in a small village by the mountains, there lived an old clockmaker who", "max_tokens": 32, "stream": True,
        "kv_compression": {"policy": "pyramidkv", "budget": 12}})
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    pieces = [json.loads(e)["choices"][0].get("text", "") for e in events if e != "[DONE]"]
    report["streamed_completion"] = {"status": status, "events": len(events), "text": "".join(pieces),
                                     "ends_with_done": bool(events) and events[-1] == "[DONE]"}
    return status == 200 and len(pieces) > 1 and events[-1] == "[DONE]"


def layer_metrics(base, report):
    with urllib.request.urlopen(base + "/metrics", timeout=REQUEST_S) as response:
        text = response.read().decode()
    layers = {}
    for name in ("strata_kv_layer_tokens", "strata_kv_layer_bytes", "strata_kv_layer_evicted_tokens_total"):
        layers[name] = {m.group(1): float(m.group(2)) for m in
                        re.finditer(name + r'\{[^}]*layer="(\d+)"[^}]*\} (\S+)', text)}
    report["metrics"] = {name: {"layers": len(v), "sum": sum(v.values())} for name, v in layers.items()}
    evicted = layers["strata_kv_layer_evicted_tokens_total"]
    return len(layers["strata_kv_layer_tokens"]) > 1 and sum(evicted.values()) > 0


def main():
    binary, port, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    base = f"http://127.0.0.1:{port}"
    command = [binary, "serve", "--config", "configs/smollm2-cpu.yaml", "--port", port, *overrides]
    report = {"command": " ".join(command), "checks": {}}
    env = dict(os.environ)
    if "STRATA_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["STRATA_LIBRARY_PATH"]
    process = subprocess.Popen(command, env=env, stdout=sys.stderr)  # stdout is the report
    try:
        wait_ready(process, base)
        for check in (chat, streamed_completion, layer_metrics):
            try:
                report["checks"][check.__name__] = check(base, report)
            except (RequestFailed, OSError, ValueError, KeyError, IndexError) as error:
                report["checks"][check.__name__] = False
                report.setdefault("errors", {})[check.__name__] = repr(error)
    except RuntimeError as error:
        report["error"] = str(error)
    finally:
        process.terminate()
        try:
            report["exit_code"] = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            report["exit_code"] = "killed after 20 s"
    print(json.dumps(report, indent=1))
    ok = "error" not in report and report["checks"] and all(report["checks"].values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
