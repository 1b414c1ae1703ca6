"""Prefix caching through the real server (kv_cache.prefix_caching is on by default), a document asked questions:
- the second question reports cached prompt tokens (usage.prompt_tokens_details.cached_tokens): the document's
  whole blocks, which /metrics counts as hits;
- the same question again reuses more (the second request published its own blocks too) and answers the same text:
  the answer does not depend on how much of the prompt came from the cache (the engine tests compare with the cache
  off, tests/leader/prefix_cache_engine_test.cpp);
- /v1/kv_state accounts for the cached blocks."""
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
