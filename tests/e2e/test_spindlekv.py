"""SpindleKV through the API (kv_compression {"policy": "spindlekv", ...}) on the real model and server:
- spindlekv requests (default, eviction-only, printed schedule) run in one batch with other policies and get
  what they get alone;
- on a 600-token prompt every layer holds the corrected schedule's k + window tokens (computed here from the
  spec's formulas), /v1/kv_state shows each layer's codebook sizes, and /metrics shows the same tokens, the same
  codebook sizes and the bytes the coded storage takes (full-precision blocks of the partial group, coded blocks
  of 20-byte rows at their share of a slot, codebook pages), below what pyramid-style eviction alone would hold;
  the blocks return;
- bad SpindleKV parameters get a 400 naming the field."""
import math
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from support import ROOT, error_of, metric, metrics, tokenizer
from test_compression import complete, token_texts, wait_idle

N_LAYERS = 30
N_KV_HEADS = 3
HEAD_DIM = 64
BLOCK_SIZE = 16
CODE_ROW_BYTES = 20  # index, magnitude, index, magnitude, position: 4 bytes each
PROMPT_TOKENS = 600


def prompt_ids(n):
    text = (ROOT / "tests" / "fixtures" / "texts" / "the_keepers_ledger.txt").read_text(encoding="utf-8")
    return tokenizer().encode(text, add_special_tokens=False).ids[:n]


def spindle_keep(layer, n, ratio=0.4, window=8, beta=0.05):
    """Tokens a layer keeps per KV head (spec section 2 with the corrected top layer)."""
    context = n - window
    rc = (ratio * n - window) / context
    alpha = (1 + beta) / 2
    if rc >= 1:
        return n
    if rc <= 0:
        return window
    if rc <= beta:
        top = bottom = beta
    elif rc <= alpha:
        top, bottom = 2 * rc - beta, beta
    else:
        top, bottom = 1.0, 2 * rc - 1
    r = top + (bottom - top) * layer / (N_LAYERS - 1)
    return min(context, math.floor(r * context + 1e-9)) + window


def test_spindlekv_runs_in_a_batch_with_other_policies(server, model_name):
    ids = prompt_ids(400)
    prompts = [ids[0:90], ids[100:170], ids[200:260], ids[300:380]]
    policies = [{"policy": "spindlekv"},
                {"policy": "spindlekv", "ratio": 0.3, "codebook": "off", "normalize": "none"},
                {"policy": "spindlekv", "ratio": 0.8, "top": "printed", "key_threshold": 0.9},
                {"policy": "pyramidkv", "budget": 32}]
    alone = [token_texts(complete(server, model_name, p, kv, max_tokens=16)) for p, kv in zip(prompts, policies)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda pk: token_texts(complete(server, model_name, *pk, max_tokens=16)),
                                 zip(prompts, policies)))
    assert together == alone


def consistent_snapshot(base_url):
    """kv_state, /metrics, kv_state until both views show the same step (decoding goes on meanwhile). The three
    requests must fall inside one decode step (about 10 ms here), so many tries: 50 of them 50 ms apart once missed
    on a loaded machine."""
    for _ in range(400):
        before = requests.get(f"{base_url}/v1/kv_state", timeout=30).json()
        samples = metrics(base_url)
        after = requests.get(f"{base_url}/v1/kv_state", timeout=30).json()
        if before["sequences"] and after["sequences"] and \
                before["sequences"][0]["uncompressed_tokens"] == after["sequences"][0]["uncompressed_tokens"]:
            return before, samples
        time.sleep(0.01)
    raise AssertionError("no consistent snapshot of /v1/kv_state and /metrics")


def test_spindlekv_layers_hold_the_schedule_and_report_codebooks(server, model_name):
    wait_idle(server.base_url)
    ids = prompt_ids(PROMPT_TOKENS)
    assert len(ids) == PROMPT_TOKENS
    body = {"model": model_name, "prompt": ids, "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
            "stream": True, "kv_compression": {"policy": "spindlekv"}}
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        lines = response.iter_lines()
        chunks = 0
        while chunks < 3:  # a few decode steps: new tokens are coded too
            chunks += next(lines).startswith(b"data: {")
        state, samples = consistent_snapshot(server.base_url)

    [seq] = state["sequences"]
    decoded = seq["uncompressed_tokens"] - len(ids)
    assert decoded >= 1
    block_bytes = state["block_bytes"]
    assert block_bytes == 2 * N_KV_HEADS * BLOCK_SIZE * HEAD_DIM * 4
    vectors_per_page = block_bytes // (HEAD_DIM * 4)
    coded_block_bytes = N_KV_HEADS * BLOCK_SIZE * CODE_ROW_BYTES
    coded_per_slot = block_bytes // coded_block_bytes  # a slot packs 25 coded blocks; each costs its share
    total_bytes = eviction_only_bytes = 0
    for layer in seq["layers"]:
        l = layer["layer"]
        assert layer["policy"].startswith("spindlekv"), layer
        tokens = spindle_keep(l, len(ids)) + decoded
        assert layer["tokens"] == tokens, (l, layer, tokens)
        book = layer["codebook"]
        # At least one entry per head; at most one per kept (head, token), keys and values apart.
        for part in ("keys", "values"):
            assert N_KV_HEADS <= book[part] <= N_KV_HEADS * tokens, (l, book)
        vectors = book["keys"] + book["values"]
        assert metric(samples, "strata_kv_layer_tokens", layer=l, pp_stage=0, tp_rank=0) == tokens
        assert metric(samples, "strata_kv_layer_codebook_vectors", layer=l, pp_stage=0, tp_rank=0) == vectors
        # Every entry is coded: full groups in coded blocks, the partial group's codes in an open coded block
        # beside the full-precision block that holds its reconstructions; vectors in whole pages. Coded blocks
        # count at their share of the slots that pack them.
        groups, partial = divmod(tokens, BLOCK_SIZE)
        expected = (groups + (partial > 0)) * block_bytes // coded_per_slot + (partial > 0) * block_bytes + \
            -(-vectors // vectors_per_page) * block_bytes
        layer_bytes = metric(samples, "strata_kv_layer_bytes", layer=l, pp_stage=0, tp_rank=0)
        assert layer_bytes == expected, (l, tokens, vectors, layer_bytes, expected)
        total_bytes += layer_bytes
        eviction_only_bytes += -(-tokens // BLOCK_SIZE) * block_bytes
    # The codebooks save memory beyond the eviction (SmolLM2's shallow layers have many similar keys).
    assert total_bytes < eviction_only_bytes, (total_bytes, eviction_only_bytes)
    print(f"spindlekv on {len(ids)} tokens: {total_bytes} bytes against {eviction_only_bytes} for eviction alone")

    state = wait_idle(server.base_url)
    assert state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]


def test_bad_spindlekv_parameters_name_the_field(server, model_name):
    def post(kv):
        return requests.post(f"{server.base_url}/v1/completions", timeout=30,
                             json={"model": model_name, "prompt": "hi", "max_tokens": 1, "kv_compression": kv})

    for kv, param in (({"policy": "spindlekv", "ratio": 1.5}, "kv_compression.ratio"),
                      ({"policy": "spindlekv", "normalize": "softmax"}, "kv_compression.normalize"),
                      ({"policy": "spindlekv", "top": "sideways"}, "kv_compression.top"),
                      ({"policy": "spindlekv", "key_threshold": 2}, "kv_compression.key_threshold"),
                      ({"policy": "spindlekv", "codebook": "maybe"}, "kv_compression.codebook"),
                      ({"policy": "spindlekv", "budget": 128}, "kv_compression.budget")):
        error = error_of(post(kv), 400)
        assert error["param"] == param, (kv, error)
    assert post({"policy": "spindlekv", "ratio": 0.2}).status_code == 200
