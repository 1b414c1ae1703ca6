"""Prefix caching through the real server (kv_cache.prefix_caching is on by default), a document asked questions:
- the second question reports cached prompt tokens (usage.prompt_tokens_details.cached_tokens): the document's
  whole blocks, which /metrics counts as hits;
- the same question again reuses more (the second request published its own blocks too) and answers the same text:
  the answer does not depend on how much of the prompt came from the cache (the engine tests compare with the cache
  off, tests/leader/prefix_cache_engine_test.cpp);
- /v1/kv_state accounts for the cached blocks, and shows how many of them a running sequence shares;
- chats share the blocks of the default system prompt."""
import uuid

import requests

from support import ROOT, metric, metrics

BLOCK_SIZE = 16


def document():
    text = (ROOT / "tests" / "fixtures" / "texts" / "a_coastal_almanac.txt").read_text(encoding="utf-8")
    # A tag of its own at the start, so that no earlier test has cached this prompt.
    return f"[{uuid.uuid4().hex}]\n" + text[:1500]


def complete(server, model_name, prompt):
    response = requests.post(f"{server.base_url}/v1/completions", timeout=300,
                             json={"model": model_name, "prompt": prompt, "max_tokens": 16, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["choices"][0]["text"], body["usage"]


def test_a_shared_document_is_prefilled_once(server, model_name):
    doc = document()
    hits_before = metric(metrics(server.base_url), "strata_prefix_cache_hits_total")
    first_text, first = complete(server, model_name, doc + "\nQuestion: what is the almanac about?\nAnswer:")
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    second_text, second = complete(server, model_name, doc + "\nQuestion: which season comes first?\nAnswer:")
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % BLOCK_SIZE == 0, second
    assert cached < second["prompt_tokens"]
    # The shared document is at least 300 tokens: all but its last partial block comes from the cache.
    assert cached >= 300 - BLOCK_SIZE, second
    assert metric(metrics(server.base_url), "strata_prefix_cache_hits_total") - hits_before == cached
    again_text, again = complete(server, model_name, doc + "\nQuestion: which season comes first?\nAnswer:")
    assert again["prompt_tokens_details"]["cached_tokens"] >= cached
    assert again_text == second_text
    state = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
    assert state["blocks_cached"] >= (cached // BLOCK_SIZE) * 30, state["blocks_cached"]


def test_kv_state_shows_the_blocks_a_running_sequence_shares(server, model_name):
    doc = document()
    complete(server, model_name, doc + "\nQuestion: who keeps the almanac?\nAnswer:")
    body = {"model": model_name, "prompt": doc + "\nQuestion: when do the tides turn?\nAnswer:", "max_tokens": 64,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                break  # the sequence is decoding now
        state = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
        for _ in response.iter_lines():
            pass
    shared = [s["prefix_blocks_shared"] for s in state["sequences"]]
    assert shared and max(shared) >= 300 // BLOCK_SIZE - 1, state["sequences"]


def test_chats_share_the_default_system_prompt(server, model_name):
    def chat(text):
        response = requests.post(f"{server.base_url}/v1/chat/completions", timeout=300,
                                 json={"model": model_name, "max_tokens": 4, "temperature": 0,
                                       "messages": [{"role": "user", "content": text}]})
        assert response.status_code == 200, response.text
        return response.json()["usage"]

    chat(f"Say hello to {uuid.uuid4().hex}.")
    usage = chat(f"Name a colour, {uuid.uuid4().hex}.")
    # SmolLM2's default system prompt and the template around it fill at least one block.
    assert usage["prompt_tokens_details"]["cached_tokens"] >= BLOCK_SIZE, usage
