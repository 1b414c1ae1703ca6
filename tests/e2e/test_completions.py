"""/v1/completions and /v1/models through the openai client: greedy output against the transformers reference,
usage, finish reasons, stop strings, logprobs, n and seeds; /v1/models/{model}; the access log."""
import math
import re
import time

import openai
import pytest
import requests

from support import (check_greedy_against_reference, completion_logprob_ids, decode, load_reference,
                     prompt_token_count)

GREEDY = {"temperature": 0}


def test_models_lists_the_served_model(server, client, model_name):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert models.data[0].object == "model"


def test_models_retrieves_the_served_model_and_only_it(server, client, model_name):
    assert client.models.retrieve(model_name) == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"
    assert "gpt-4o" in missing.value.message


@pytest.fixture(scope="module")
def code_greedy(client, model_name):
    """The code-and-digits reference prompt, greedy, with logprobs=3 (one request shared by several tests)."""
    reference = load_reference("code_digits")
    response = client.completions.create(model=model_name, prompt=reference["text"], max_tokens=16, logprobs=3,
                                         **GREEDY)
    return reference, response


def test_greedy_matches_reference(code_greedy):
    reference, response = code_greedy
    choice = response.choices[0]
    ids = completion_logprob_ids(choice)
    assert len(ids) == 16
    matched = check_greedy_against_reference(ids, reference, "completions code_digits")
    assert choice.text.startswith(decode(ids[:matched]))
    if matched == len(ids):
        assert choice.text == decode(ids)


def test_usage_and_length_finish(code_greedy):
    reference, response = code_greedy
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens == len(reference["prompt_ids"])
    assert response.usage.completion_tokens == 16
    assert response.usage.total_tokens == len(reference["prompt_ids"]) + 16


def test_logprobs_are_consistent(code_greedy):
    _, response = code_greedy
    logprobs = response.choices[0].logprobs
    n = len(logprobs.tokens)
    assert len(logprobs.token_logprobs) == n and len(logprobs.top_logprobs) == n and len(logprobs.text_offset) == n
    assert "".join(logprobs.tokens) == response.choices[0].text
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert logprob <= 0.0
        assert len(top) == 3, top
        # OpenAI lists the alternatives most likely first; clients read the JSON object in that order.
        assert list(top.values()) == sorted(top.values(), reverse=True), top
        assert all(value <= 0.0 for value in top.values())
        assert sum(math.exp(value) for value in top.values()) <= 1.0 + 1e-4
        # Greedy: the chosen token is the most likely one, so it heads its own top list.
        assert token in top, (token, top)
        assert top[token] == pytest.approx(logprob, abs=1e-5)
        assert logprob == pytest.approx(max(top.values()), abs=1e-5)
    offsets = logprobs.text_offset
    assert offsets[0] == 0
    assert all(b - a == len(t.encode("utf-8")) for a, b, t in zip(offsets, offsets[1:], logprobs.tokens))


def test_prompt_as_token_ids(client, model_name):
    reference = load_reference("short_text")
    response = client.completions.create(model=model_name, prompt=reference["prompt_ids"], max_tokens=4, logprobs=0,
                                         **GREEDY)
    assert response.usage.prompt_tokens == len(reference["prompt_ids"])
    check_greedy_against_reference(completion_logprob_ids(response.choices[0]), reference,
                                   "completions short_text (token-id prompt)")


def test_stop_string_cuts_before_it(client, model_name):
    reference = load_reference("short_text")
    full = decode(reference["greedy_ids"][:16])
    # A stop string that starts inside a token (the reference continues " now, he's gone. He's gone to the sea.").
    stop = "one. He"
    assert stop in full, full
    response = client.completions.create(model=model_name, prompt=reference["text"], max_tokens=16, stop=[stop],
                                         **GREEDY)
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == full[:full.index(stop)]
    assert response.usage.completion_tokens < 16


def test_n2_with_seed_is_reproducible(client, model_name):
    request = dict(model=model_name, prompt="Once upon a time, in a small village by the sea,", max_tokens=8, n=2,
                   seed=1234, temperature=1.0)
    first = client.completions.create(**request)
    second = client.completions.create(**request)
    assert sorted(c.index for c in first.choices) == [0, 1]
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(second.choices, key=lambda c: c.index)]
    assert all(c.finish_reason in ("length", "stop") for c in first.choices)
    assert first.usage.prompt_tokens == prompt_token_count(request["prompt"])
    assert 2 <= first.usage.completion_tokens <= 16


def test_raw_response_shape(server, model_name):
    response = requests.post(f"{server.base_url}/v1/completions", timeout=120,
                             json={"model": model_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == model_name
    assert body["choices"][0]["index"] == 0
    n_prompt = prompt_token_count("Hello")
    # "Hello" is shorter than a KV block: nothing of it can come from the prefix cache.
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 1, "total_tokens": n_prompt + 1,
                             "prompt_tokens_details": {"cached_tokens": 0}}


def test_each_request_has_an_access_log_line(server, model_name):
    """server.access_log (on in configs/smollm2-cpu.yaml): the client, the request line, the status, the seconds and
    a generation's id, in the server's log."""
    response = requests.post(f"{server.base_url}/v1/completions", timeout=120,
                             json={"model": model_name, "prompt": "Hello", "max_tokens": 1})
    assert response.status_code == 200, response.text
    completion_id = response.json()["id"]
    assert requests.get(f"{server.base_url}/v1/models/none?x=1", timeout=30).status_code == 404
    deadline = time.monotonic() + 10
    while True:  # the line is written after the answer
        lines = server.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        logged = [line for line in lines if completion_id in line or '"GET /v1/models/none?x=1"' in line]
        if len(logged) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(logged) == 2, lines[-10:]
    assert re.fullmatch(rf'strata http: 127\.0\.0\.1:\d+ "POST /v1/completions" 200 \d+\.\d{{3}}s {completion_id}',
                        logged[0]), logged[0]
    assert re.fullmatch(r'strata http: 127\.0\.0\.1:\d+ "GET /v1/models/none\?x=1" 404 \d+\.\d{3}s', logged[1]), logged
