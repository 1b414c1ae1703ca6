"""Pipeline micro-batching (parallel.micro_batches, docs/distributed.md): a PP=2 and a PP=3 world of `strata serve`
cut every step into micro-batches (decode rows, and prompt chunks between tokens) that flow through the stages one
behind the other. For a batch of concurrent requests, some with full caches and some with SnapKV evicting from
their prompts (its window statistics then add up over the pieces of a chunk), every request gets the greedy tokens
one process gives it, and every layer evicts as many entries as in the single process.

Micro-batches change the row count of the GEMMs, and OpenBLAS's kernels sum in an order that depends on it (measured:
up to 1.6e-5 on a log-probability), so logits are compared within LOGPROB_TOLERANCE and a greedy step whose top-2
margin in the single process is below NEAR_TIE may go either way (then the rest of that sequence is another
continuation and is not compared).
"""
import threading

import openai
import pytest
from distributed_world import run
from support import ROOT, metrics
from test_distributed_serve import World

LOGPROB_TOLERANCE = 1e-4
NEAR_TIE = 1e-3
N_TOKENS = 12
SNAPKV = {"policy": "snapkv", "budget": 48}


def ledger(n_words, skip=0):
    text = (ROOT / "tests" / "fixtures" / "texts" / "the_keepers_ledger.txt").read_text(encoding="utf-8")
    return " ".join(text.split()[skip:skip + n_words])


# Prompts of different lengths (a few tokens to a few hundred), full or SnapKV, sent together.
REQUESTS = [
    ("The three primary colours are", None),
    (ledger(150), SNAPKV),
    ("def fibonacci(n):", None),
    (ledger(90, skip=400), SNAPKV),
    (ledger(40, skip=900), None),
]


def generate_together(world):
    """Every request at once, greedy with the top-2 log-probabilities: [(token texts, top-2 logprobs per step)]."""
    client = openai.OpenAI(base_url=f"{world.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    results = [None] * len(REQUESTS)
    barrier = threading.Barrier(len(REQUESTS))

    def one(i):
        prompt, policy = REQUESTS[i]
        extra = {"ignore_eos": True, **({"kv_compression": policy} if policy else {})}
        barrier.wait()
        response = client.completions.create(model=model, prompt=prompt, max_tokens=N_TOKENS, temperature=0,
                                             logprobs=2, extra_body=extra)
        lp = response.choices[0].logprobs
        results[i] = (lp.tokens, [sorted(top.values(), reverse=True) for top in lp.top_logprobs], lp.token_logprobs)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in results), "a request failed"
    return results


def assert_same(got, want, what):
    g_tokens, _, g_lps = got
    w_tokens, w_tops, w_lps = want
    assert len(g_tokens) == len(w_tokens) == N_TOKENS, what
    for step, (g, w) in enumerate(zip(g_tokens, w_tokens)):
        if g != w:
            margin = w_tops[step][0] - w_tops[step][1]
            assert margin < NEAR_TIE, f"{what}: step {step}: {g!r}, one process has {w!r} (margin {margin:.3g})"
            return
        assert abs(g_lps[step] - w_lps[step]) <= LOGPROB_TOLERANCE, (what, step, g_lps[step], w_lps[step])


@pytest.fixture(scope="module")
def single():
    world = World(1, 1)
    try:
        yield generate_together(world), evicted_per_layer(world)
    finally:
        world.stop()


def evicted_per_layer(world):
    samples = metrics(world.base_url)["strata_kv_layer_evicted_tokens_total"]
    evicted = {}
    for labels, value in samples.items():
        layer = int(dict(labels)["layer"])
        evicted[layer] = evicted.get(layer, 0) + value
    return evicted


@pytest.mark.parametrize("pp,micro_batches", [(2, None), (3, None), (2, 3)])
def test_micro_batched_pipeline_generates_what_one_process_generates(single, pp, micro_batches):
    settings = [f"parallel.micro_batches={micro_batches}"] if micro_batches else []
    world = World(1, pp, settings)
    try:
        got = generate_together(world)
        evicted = evicted_per_layer(world)
    finally:
        world.stop()
    want, want_evicted = single
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"pp={pp} micro_batches={micro_batches or pp}: request {i}")
    assert len(want_evicted) == 30 and min(want_evicted.values()) > 0, want_evicted
    assert evicted == want_evicted


def test_micro_batches_below_one_are_a_start_up_error():
    done = run("generate", 1, 2, ["--prompt", "Hi", "--max-tokens", "2"], ["parallel.micro_batches=0"])
    assert done.returncode != 0
    assert "parallel.micro_batches: expected an integer in [1, 1024], got '0'" in done.stderr
