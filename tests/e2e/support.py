"""Helpers shared by the end-to-end tests: the reference fixtures, token ids from what the API returns, metrics."""
import json
import signal
import subprocess
import sys
import threading
import time
import warnings
from functools import lru_cache
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REFERENCE_DIR = ROOT / "tests" / "fixtures" / "reference"
NEAR_TIE = 1e-3  # a greedy step whose top-1/top-2 logit margin is below this may legitimately go either way
STOP_IDS = (0, 2)  # <|endoftext|>, <|im_end|>
# `strata eval` options for a run of seconds: one document, a 64-token prefix, 8 scored tokens, no other task.
EVAL_TINY_TASK = ["--documents", "sqlite_btree", "--ppl-prefixes", "64", "--ppl-tokens", "8", "--long-docs", "0",
                  "--retrieval-lengths", "", "--ruler-lengths", "", "--passkey-lengths", "", "--agreement-prompts", "0",
                  "--set", "kv_cache.memory_mib=64"]

sys.path.insert(0, str(ROOT / "tools"))
from listen_port import free_port  # noqa: E402,F401  (the tests import it from here)
from reference_tokenizer import build_reference_tokenizer, encode_without_specials  # noqa: E402


@lru_cache(maxsize=1)
def tokenizer():
    return build_reference_tokenizer(str(MODEL))


def load_reference(name):
    return json.loads((REFERENCE_DIR / f"{name}.json").read_text(encoding="utf-8"))


def prompt_token_count(text):
    """Tokens of a completions prompt: user text, so special-token strings are not parsed."""
    return len(encode_without_specials(tokenizer(), text))


def decode(ids):
    return tokenizer().decode(list(ids), skip_special_tokens=True)


def _byte_decoder():
    """GPT-2 byte-level alphabet, inverted: the printable bytes stand for themselves, the other 68 bytes were
    shifted, in increasing order, to U+0100 onwards (shared/specs/model_format.md, section 6)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    decoder = {chr(b): b for b in printable}
    decoder.update({chr(0x100 + i): b for i, b in enumerate(shifted)})
    return decoder


@lru_cache(maxsize=1)
def _ids_by_bytes():
    """Token bytes -> id; None where two tokens share the same bytes (then a token cannot be identified)."""
    tok = tokenizer()
    decoder = _byte_decoder()
    specials = {t.content for t in tok.get_added_tokens_decoder().values()}
    table = {}
    for text, token_id in tok.get_vocab(with_added_tokens=True).items():
        key = text.encode("utf-8") if text in specials else bytes(decoder[c] for c in text)
        table[key] = None if key in table else token_id
    return table


def id_of_bytes(token_bytes):
    token_id = _ids_by_bytes().get(bytes(token_bytes))
    if token_id is None:
        raise AssertionError(f"no unique vocabulary token has the bytes {bytes(token_bytes)!r}")
    return token_id


def chat_logprob_ids(choice):
    """Token ids of a chat choice, from the exact bytes in its logprobs."""
    return [id_of_bytes(entry.bytes) for entry in choice.logprobs.content]


def completion_logprob_ids(choice):
    """Token ids of a completions choice, from its logprobs tokens (exact for tokens that are whole UTF-8)."""
    return [id_of_bytes(token.encode("utf-8")) for token in choice.logprobs.tokens]


def check_greedy_against_reference(got_ids, reference, what):
    """got_ids must equal the reference's greedy ids token for token. A first difference at a near tie (margin
    below NEAR_TIE) is reported as a warning and the comparison stops there; anywhere else it fails."""
    want = reference["greedy_ids"][:len(got_ids)]
    for step, (got, expected) in enumerate(zip(got_ids, want)):
        if got == expected:
            continue
        margin = reference["greedy_margins"][step]
        message = (f"{what}: greedy token {step} is {got} ({decode([got])!r}), the reference has {expected} "
                   f"({decode([expected])!r}); reference top-1/top-2 margin there {margin:.3g}; "
                   f"same up to here: {decode(want[:step])!r}")
        if margin < NEAR_TIE:
            warnings.warn(f"near tie, not a failure: {message}")
            return step
        raise AssertionError(message)
    return len(got_ids)


def error_of(response, status):
    """Checks an error response's status and OpenAI error body; returns the error object."""
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text[:500]}"
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    return error


def metrics(base_url):
    """/metrics parsed by prometheus_client: {sample name: {frozenset(label items): value}}."""
    response = requests.get(f"{base_url}/metrics", timeout=30)
    assert response.status_code == 200, response.text[:500]
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def metric(samples, name, **labels):
    values = samples.get(name)
    assert values is not None, f"/metrics has no {name}"
    key = frozenset((k, str(v)) for k, v in labels.items())
    assert key in values, f"/metrics has no {name} with labels {labels}: {sorted(map(dict, values))[:5]}"
    return values[key]


def wait_until_ready(process, url, name, timeout_s, log_tail, interval_s=0.2):
    """Polls url until it answers 200. Fails the test, with the process's log, if the process exits first or the
    time runs out."""
    import pytest  # only the fixtures call this

    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode} during start-up:\n{log_tail()}")
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{name} did not answer {url} within {timeout_s} s:\n{log_tail()}")
        time.sleep(interval_s)


def stop_process(process, timeout_s):
    """SIGTERM, then SIGKILL if it has not exited within timeout_s."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


CALL_BOUND_S = 60  # generous: a call ends within seconds of its server draining or its stream being cut


class CompletionCall(threading.Thread):
    """One completions request on a thread of its own: streamed (the events, decoded) or not (the response)."""

    def __init__(self, base_url, max_tokens, stream):
        super().__init__(daemon=True)
        self.url = f"{base_url}/v1/completions"
        self.body = {"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time", "max_tokens": max_tokens,
                     "temperature": 0, "ignore_eos": True, "stream": stream}
        self.first_event = threading.Event()
        self.events, self.response, self.failure = [], None, None
        self.start()

    def run(self):
        try:
            with requests.post(self.url, json=self.body, stream=self.body["stream"], timeout=300) as response:
                self.response = response
                if not self.body["stream"] or response.status_code != 200:
                    response.content  # noqa: B018 (reads the body)
                    return
                for line in response.iter_lines():
                    if line.startswith(b"data: "):
                        self.events.append(line[6:].decode())
                        self.first_event.set()
        except requests.RequestException as e:
            self.failure = e
        finally:
            self.first_event.set()

    @property
    def status(self):
        return None if self.response is None else self.response.status_code

    def result(self):
        self.join(timeout=CALL_BOUND_S)
        assert not self.is_alive(), "the request did not end"
        assert self.failure is None, self.failure
        return self.response

    def streamed_tokens(self):
        """The number of text chunks before [DONE], and the finish reason; asserts the stream ended properly."""
        assert self.events and self.events[-1] == "[DONE]", self.events[-3:]
        chunks = [json.loads(e) for e in self.events[:-1]]
        assert all("error" not in c for c in chunks), chunks[-1]
        return sum(1 for c in chunks if c["choices"] and c["choices"][0]["text"]), chunks[-1]["choices"][0]
