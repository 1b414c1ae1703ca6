"""KV quantization (kv_cache.dtype) through the shipped binary: the same ~1,000-token prompt with SimLayerKV, on a
server with an f32 cache and on one with int4 (the seed's headline configuration). While the request decodes,
/metrics shows every layer at the pool memory its blocks take (sealed groups at their share of the slots that pack
them, the rest at full precision: computed here from the documented block format), far below the f32 run, and
/v1/kv_state agrees; afterwards every block is back in the pool."""
import pytest
import requests

from serve_process import ServeProcess
from support import ROOT, metric, metrics, tokenizer

N_LAYERS = 30
N_KV_HEADS, HEAD_DIM, GROUP = 3, 64, 32
F32_BLOCK_BYTES = 2 * N_KV_HEADS * GROUP * HEAD_DIM * 4  # 49,152: 32 entries of K and V at fp32
# int4 block (kernels/kv_block_layout.h): 4-bit codes of K and V, an fp16 scale and min per (head, channel) for the
# keys and per (head, entry, 32 channels) for the values.
INT4_BLOCK_BYTES = 2 * N_KV_HEADS * GROUP * HEAD_DIM // 2 + 2 * N_KV_HEADS * HEAD_DIM * 2 + \
    2 * N_KV_HEADS * GROUP * (HEAD_DIM // GROUP) * 2  # 7,680
# A slot (the memory of one f32 block) packs as many int4 blocks as fit, and each costs the pool its share.
INT4_PER_SLOT = F32_BLOCK_BYTES // INT4_BLOCK_BYTES  # 6


def int4_pool_bytes(n_blocks):
    return n_blocks * F32_BLOCK_BYTES // INT4_PER_SLOT


PROMPT_TOKENS = 1000
POLICY = {"policy": "simlayerkv", "window": 128, "n_init": 4}


@pytest.fixture(scope="module")
def servers():
    started = {dtype: ServeProcess(["kv_cache.block_size=32", f"kv_cache.dtype={dtype}", "kv_cache.memory_mib=256"],
                                   f"strata serve ({dtype})")
               for dtype in ("f32", "int4")}
    try:
        for s in started.values():
            s.wait_ready()
        yield started
    finally:
        for s in started.values():
            s.stop()


def prompt_ids():
    text = (ROOT / "tests" / "fixtures" / "texts" / "a_coastal_almanac.txt").read_text(encoding="utf-8")
    ids = tokenizer().encode(text, add_special_tokens=False).ids
    assert len(ids) >= PROMPT_TOKENS
    return ids[:PROMPT_TOKENS]


def snapshot_while_decoding(server, ids, max_tokens=48):
    """Streams a completion; after a few decode steps (the SimLayerKV decision and the first seals are done) takes
    /metrics and /v1/kv_state, then reads the rest. Returns (metrics samples, kv_state, generated text)."""
    body = {"model": "SmolLM2-135M-Instruct", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "kv_compression": POLICY}
    chunks, samples, state = [], None, None
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        for line in response.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            chunks.append(line)
            if len(chunks) == 4:
                samples = metrics(server.base_url)
                state = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
    assert samples is not None, f"the stream ended after {len(chunks)} chunks"
    return samples, state, b"".join(chunks)


def wait_idle(server):
    for _ in range(300):
        state = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
        if not state["sequences"] and state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]:
            return
        __import__("time").sleep(0.2)
    raise AssertionError(f"KV still held after the request ended: {state}")


def layer_metrics(samples, name):
    return [metric(samples, name, layer=l, pp_stage=0, tp_rank=0) for l in range(N_LAYERS)]


def test_simlayerkv_int4_holds_its_layers_at_the_quantized_block_size(servers):
    ids = prompt_ids()
    runs = {dtype: snapshot_while_decoding(s, ids) for dtype, s in servers.items()}
    f32_samples, _, _ = runs["f32"]
    int4_samples, int4_state, _ = runs["int4"]

    tokens = {d: layer_metrics(runs[d][0], "strata_kv_layer_tokens") for d in runs}
    held = {d: layer_metrics(runs[d][0], "strata_kv_layer_bytes") for d in runs}
    # Quantization changes what a layer holds only through SimLayerKV's verdicts, which are taken on the
    # unquantized cache: the same layers are lazy in both runs.
    lazy = {d: [metric(runs[d][0], "strata_kv_layer_lazy_decisions_total", layer=l, pp_stage=0, tp_rank=0,
                       lazy="true") for l in range(N_LAYERS)] for d in runs}
    assert lazy["int4"] == lazy["f32"]
    assert 0 < sum(lazy["int4"]) < N_LAYERS, "expected some lazy and some full layers on this prompt"

    for layer in range(N_LAYERS):
        t = tokens["int4"][layer]
        assert t <= PROMPT_TOKENS + 48
        # Sealed groups at their share of a slot, the newest entries (fewer than a group) at full precision.
        expected = int4_pool_bytes(t // GROUP) + (F32_BLOCK_BYTES if t % GROUP else 0)
        assert held["int4"][layer] == expected, (layer, t, held["int4"][layer], expected)
        f = tokens["f32"][layer]
        assert held["f32"][layer] == -(-f // GROUP) * F32_BLOCK_BYTES, (layer, f)
        uncompressed = metric(int4_samples, "strata_kv_layer_uncompressed_bytes", layer=layer, pp_stage=0, tp_rank=0)
        assert uncompressed >= -(-PROMPT_TOKENS // GROUP) * F32_BLOCK_BYTES

    total_f32, total_int4 = sum(held["f32"]), sum(held["int4"])
    assert total_int4 < total_f32 / 4, (total_int4, total_f32)
    ratio_f32 = metric(f32_samples, "strata_kv_compression_ratio")
    ratio_int4 = metric(int4_samples, "strata_kv_compression_ratio")
    assert ratio_int4 > 4 * ratio_f32, (ratio_int4, ratio_f32)
    assert metric(int4_samples, "strata_kv_saved_bytes") > metric(f32_samples, "strata_kv_saved_bytes")
    print(f"\n[measured] simlayerkv (window 128) on {PROMPT_TOKENS} tokens: {sum(lazy['int4'])} of {N_LAYERS} "
          f"layers lazy; KV bytes f32 {total_f32}, int4 {total_int4} ({total_f32 / total_int4:.2f}x less); "
          f"compression ratio f32 {ratio_f32:.2f}, int4 {ratio_int4:.2f}")

    # /v1/kv_state shows the same per-layer bytes as /metrics did a moment earlier, below the uncompressed bytes.
    layers = int4_state["layers"]
    assert len(layers) == N_LAYERS
    for entry in layers:
        assert 0 < entry["bytes"] < entry["uncompressed_bytes"] / 4, entry
    for s in servers.values():
        wait_idle(s)


def test_int4_completes_like_any_request_and_gives_its_blocks_back(servers):
    server = servers["int4"]
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is", "max_tokens": 40,
            "temperature": 0, "ignore_eos": True}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
    assert response.status_code == 200, response.text[:500]
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 40
    wait_idle(server)
