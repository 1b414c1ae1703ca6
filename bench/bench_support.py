"""What the benchmark scripts share: a free port, waiting for a server's /health, the machine they ran on, the
committed test texts as SmolLM2 token ids, and one streamed completion timed over HTTP."""
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import httpx
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from listen_port import free_port  # noqa: E402,F401  (the benchmarks import it from here)

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "strata"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def commit():
    """The short hash of the checkout's HEAD, for a result file."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def token_ids(text_name, binary=BINARY, model=MODEL):
    """A committed test text (tests/fixtures/texts/) as the model's token ids, by `strata tokenize`."""
    text = (ROOT / "tests" / "fixtures" / "texts" / text_name).read_text(encoding="utf-8")
    done = subprocess.run([str(binary), "tokenize", "--model", str(model)], input=json.dumps(text),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def document_and_questions(doc_tokens, question_tokens, n_questions):
    """A long document (the first doc_tokens token ids of the_keepers_ledger.txt) and n_questions questions
    (consecutive question_tokens slices of a_coastal_almanac.txt), for the shared-document workloads."""
    document = token_ids("the_keepers_ledger.txt")[:doc_tokens]
    pool = token_ids("a_coastal_almanac.txt")
    questions = [pool[i * question_tokens:(i + 1) * question_tokens] for i in range(n_questions)]
    if len(document) != doc_tokens or any(len(q) != question_tokens for q in questions):
        raise ValueError("the texts are too short for that many tokens")
    return document, questions


async def one_request(client: httpx.AsyncClient, url, body, on_first_token=None):
    """Sends one streaming completion (body asks for stream and include_usage) and reads it to its end: time to
    first token and to the end (seconds from sending), usage's cached_tokens, the generated text, and the tokens
    when the body asked for logprobs. on_first_token, if given, is called once when the first text arrives."""
    sent = time.perf_counter()
    first = None
    cached = None
    text = []
    tokens = []
    async with client.stream("POST", url, json=body, timeout=600) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code}: {(await response.aread()).decode()[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            choice = chunk["choices"][0] if chunk.get("choices") else {}
            if choice.get("text"):
                text.append(choice["text"])
                if first is None:
                    first = time.perf_counter()
                    if on_first_token:
                        on_first_token()
            if choice.get("logprobs"):
                tokens += choice["logprobs"]["tokens"]
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    result = {"ttft_s": (first or time.perf_counter()) - sent, "end_s": time.perf_counter() - sent,
              "cached_tokens": cached, "text": "".join(text)}
    if "logprobs" in body:
        result["tokens"] = tokens
    return result
