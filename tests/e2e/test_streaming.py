"""Streaming (server-sent events): streamed equals non-streamed, the raw SSE framing, 8 concurrent streams that
each equal their request sent alone, and a client that goes away mid-stream."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from support import load_reference, metric, metrics, prompt_token_count


def collect_stream(stream, chat):
    """(text, finish_reason, usage) of a one-choice stream."""
    text, finish_reason, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            assert choice.index == 0
            piece = choice.delta.content if chat else choice.text
            text.append(piece or "")
            if choice.finish_reason is not None:
                assert finish_reason is None, "two chunks carry a finish_reason"
                finish_reason = choice.finish_reason
    return "".join(text), finish_reason, usage


def test_completion_stream_equals_non_stream(client, model_name):
    prompt = load_reference("code_digits")["text"]
    request = dict(model=model_name, prompt=prompt, max_tokens=12, temperature=0)
    whole = client.completions.create(**request)
    text, finish_reason, usage = collect_stream(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **request), chat=False)
    assert text == whole.choices[0].text
    assert finish_reason == whole.choices[0].finish_reason == "length"
    assert usage is not None, "include_usage asked for a usage chunk"
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, 12)


def test_chat_stream_equals_non_stream(client, model_name):
    reference = load_reference("chat_capital")
    request = dict(model=model_name, messages=reference["messages"], max_tokens=32, temperature=0)
    whole = client.chat.completions.create(**request)
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request)
    text, finish_reason, usage = collect_stream(stream, chat=True)
    assert text == whole.choices[0].message.content
    assert finish_reason == whole.choices[0].finish_reason == "stop"
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == len(reference["prompt_ids"])


def test_raw_sse_framing(server, model_name):
    with requests.post(f"{server.base_url}/v1/chat/completions", stream=True, timeout=120,
                       json={"model": model_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                             "temperature": 0, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines(decode_unicode=True) if line]
    assert all(line.startswith("data: ") for line in events), events
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in events[:-1]]
    assert chunks, "no chunk before [DONE]"
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):\n",
    "Ten facts about the planet Mars: 1.",
    "Dear Sir, I write to inform you that",
    "The recipe calls for 3 eggs, 200 grams of flour and",
    "In the beginning of the nineteenth century, the town of",
    "Q: What is the boiling point of water?\nA:",
    "import numpy as np\nx = np.arange(10)\n",
]


def stream_text(client, model_name, prompt):
    stream = client.completions.create(model=model_name, prompt=prompt, max_tokens=8, temperature=0, stream=True)
    text, finish_reason, _ = collect_stream(stream, chat=False)
    return text, finish_reason


def test_eight_concurrent_streams_equal_each_alone(client, model_name):
    alone = [stream_text(client, model_name, p) for p in PROMPTS]
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: stream_text(client, model_name, p), PROMPTS))
    for prompt, one, many in zip(PROMPTS, alone, together):
        assert many == one, f"prompt {prompt!r}: alone {one!r}, with 7 others {many!r}"
    assert all(reason in ("length", "stop") for _, reason in together)


def test_client_disconnect_mid_stream_leaves_server_healthy(server, client, model_name):
    aborted_before = metric(metrics(server.base_url), "strata_requests_total", finish_reason="abort")
    with requests.post(f"{server.base_url}/v1/completions", stream=True, timeout=120,
                       json={"model": model_name, "prompt": load_reference("short_text")["text"],
                             "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True}) as response:
        assert response.status_code == 200
        chunks = 0
        for line in response.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunks += 1
                if chunks == 2:
                    break
        assert chunks == 2
    # Closing the connection must cancel the request well before its 500 tokens are done.
    deadline = time.monotonic() + 60
    while metric(metrics(server.base_url), "strata_requests_total", finish_reason="abort") == aborted_before:
        assert time.monotonic() < deadline, "the abandoned request was not cancelled within 60 s"
        time.sleep(0.5)
    server.assert_alive()
    response = client.completions.create(model=model_name, prompt="Hello", max_tokens=2, temperature=0)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens == prompt_token_count("Hello")
