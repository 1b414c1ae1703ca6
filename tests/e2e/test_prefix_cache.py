"""Prefix caching through the real server (kv_cache.prefix_caching is on by default), a document asked questions:
- the second question reports cached prompt tokens (usage.prompt_tokens_details.cached_tokens): the document's
  whole blocks, which /metrics counts as hits;
- the same question again reuses more (the second request published its own blocks too) and answers the same text:
  the answer does not depend on how much of the prompt came from the cache (the engine tests compare with the cache
  off, tests/leader/prefix_cache_engine_test.cpp);
- /v1/kv_state accounts for the cached blocks, and shows how many of them a running sequence shares;
- chats share the blocks of the default system prompt;
- a burst of chats (one and two turns) and document questions, with `full` and with PyramidKV, answers what a
  server with the cache off answers, and afterwards no cached block is in use and every block is free or cached;
- a pool too small for several documents evicts the older ones' cached blocks instead of preempting or failing."""
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serve_process import ServeProcess
from support import ROOT, encode_without_specials, id_of_bytes, metric, metrics, tokenizer

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
        # One iterator for the whole stream: dropping one closes the connection, which cancels the request.
        lines = response.iter_lines()
        for line in lines:
            if line.startswith(b"data: {"):
                break  # the sequence is decoding now
        state = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
        for _ in lines:
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


@pytest.fixture(scope="module")
def uncached():
    process = ServeProcess(["kv_cache.prefix_caching=off"], "strata serve (prefix caching off)")
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def burst_requests(tag):
    """Chats with the default system prompt (a second turn repeats the first), and one document's questions."""
    doc = f"[{tag}]\n" + document()[40:1000]
    chats = [[{"role": "user", "content": "What is a lighthouse for?"}],
             [{"role": "user", "content": "Name three colours."}],
             [{"role": "user", "content": "Tell me about tides."},
              {"role": "assistant", "content": "Tides are the rise and fall of the sea, caused by the Moon."},
              {"role": "user", "content": "Why do they matter to sailors?"}]]
    out = [("chat", {"messages": m}) for m in chats]
    out += [("completion", {"prompt": doc + f"\nQuestion: {q}\nAnswer:"})
            for q in ("what is the almanac about?", "which month is the coldest?", "who reads it?")]
    return out


def answer(base_url, model_name, kind, body, policy):
    body = {"model": model_name, "max_tokens": 12, "temperature": 0, **body}
    if policy:
        body["kv_compression"] = policy
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    response = requests.post(base_url + path, json=body, timeout=300)
    assert response.status_code == 200, response.text
    choice, usage = response.json()["choices"][0], response.json()["usage"]
    return (choice["message"]["content"] if kind == "chat" else choice["text"]), usage


def idle_state(base_url):
    deadline = time.monotonic() + 30
    while True:
        state = requests.get(f"{base_url}/v1/kv_state", timeout=30).json()
        if not state["sequences"] or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


@pytest.mark.parametrize("policy", [None, {"policy": "pyramidkv", "budget": 64}])
def test_a_burst_sharing_prefixes_answers_what_it_answers_without_the_cache(server, uncached, model_name, policy):
    requests_ = burst_requests(uuid.uuid4().hex)

    def run(base_url):
        # The first of each kind alone (it publishes), then the rest at once.
        first = [answer(base_url, model_name, *requests_[i], policy) for i in (0, 3)]
        with ThreadPoolExecutor(len(requests_)) as pool:
            rest = list(pool.map(lambda r: answer(base_url, model_name, *r, policy),
                                 [r for i, r in enumerate(requests_) if i not in (0, 3)]))
        return [first[0], *rest[:2], first[1], *rest[2:]]

    cached = run(server.base_url)
    plain = run(uncached.base_url)
    assert [text for text, _ in cached] == [text for text, _ in plain]
    assert all(usage["prompt_tokens_details"]["cached_tokens"] == 0 for _, usage in plain)
    hits = [usage["prompt_tokens_details"]["cached_tokens"] for _, usage in cached]
    # The chats share the system prompt's block; the questions all but the last partial block of the document.
    assert all(h >= BLOCK_SIZE for h in hits[1:3]) and all(h >= 240 for h in hits[4:]), hits
    state = idle_state(server.base_url)
    assert not state["sequences"], state["sequences"]
    assert state["prefix_blocks_in_use"] == 0
    assert state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]
    samples = metrics(server.base_url)
    per_layer = samples["strata_kv_layer_prefix_cached_blocks"]
    assert len(per_layer) == 30 and set(per_layer.values()) == {metric(samples, "strata_prefix_cache_blocks")}
    assert state["blocks_cached"] == 30 * metric(samples, "strata_prefix_cache_blocks")


def test_a_short_pool_evicts_cached_blocks_before_it_preempts_anyone(model_name):
    """16 MiB holds some 360 tokens in all 30 layers: each new ~250-token document needs the blocks that cache the
    previous one. They are evicted (no preemption, no error), and the newest document stays cached."""
    small = ServeProcess(["kv_cache.memory_mib=16"], "strata serve (16 MiB pool)").wait_ready()
    try:
        text = (ROOT / "tests" / "fixtures" / "texts" / "a_coastal_almanac.txt").read_text(encoding="utf-8")
        docs = [f"[{i}] " + text[i * 1000:i * 1000 + 900] + "\nSummary:" for i in range(4)]
        usages = [complete(small, model_name, doc)[1] for doc in docs]
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0] * 4
        samples = metrics(small.base_url)
        assert metric(samples, "strata_preemptions_total") == 0
        total = metric(samples, "strata_kv_blocks_total") // 30
        assert sum(u["prompt_tokens"] for u in usages) > total * BLOCK_SIZE, "the documents fit together"
        _, again = complete(small, model_name, docs[-1])
        assert again["prompt_tokens_details"]["cached_tokens"] >= usages[-1]["prompt_tokens"] - 2 * BLOCK_SIZE
        _, first_again = complete(small, model_name, docs[0])
        assert first_again["prompt_tokens_details"]["cached_tokens"] == 0, "the first document was evicted"
        state = idle_state(small.base_url)
        assert state["prefix_blocks_in_use"] == 0
        assert state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]
    finally:
        small.stop()


def test_a_chats_next_turn_finds_the_answer_cached(server, model_name):
    """The blocks of a generated answer are published as it is generated (with `full` on an f32 pool), so the next
    turn, whose prompt repeats it, finds every whole block it shares with the first turn's tokens cached. They share
    the prompt and the answer up to where the answer's text, tokenized again, differs from the generated tokens (the
    model may pick a split that BPE would not, e.g. "r" "yn" for "ryn"); the last generated token has no KV."""
    def chat(messages, max_tokens):
        response = requests.post(f"{server.base_url}/v1/chat/completions", timeout=300,
                                 json={"model": model_name, "max_tokens": max_tokens, "temperature": 0,
                                       "messages": messages, "logprobs": True})
        assert response.status_code == 200, response.text
        body = response.json()
        return body["choices"][0], body["usage"]

    for _ in range(3):  # a story whose tokens survive tokenizing again for at least a block past the prompt
        first = [{"role": "user", "content": f"Tell me a story about a lighthouse keeper ({uuid.uuid4().hex})."}]
        choice, usage = chat(first, 64)
        answer = choice["message"]["content"]
        generated = [id_of_bytes(entry["bytes"]) for entry in choice["logprobs"]["content"]]
        retokenized = encode_without_specials(tokenizer(), answer)
        agreeing = next((i for i, (a, b) in enumerate(zip(generated, retokenized)) if a != b),
                        min(len(generated), len(retokenized)))
        shared = usage["prompt_tokens"] + min(agreeing, usage["completion_tokens"] - 1)
        if shared >= usage["prompt_tokens"] + BLOCK_SIZE:
            break
    assert usage["completion_tokens"] >= 3 * BLOCK_SIZE, usage
    _, next_usage = chat(first + [{"role": "assistant", "content": answer},
                                  {"role": "user", "content": "And then?"}], 4)
    cached = next_usage["prompt_tokens_details"]["cached_tokens"]
    assert cached == shared // BLOCK_SIZE * BLOCK_SIZE, (usage, next_usage, agreeing)
