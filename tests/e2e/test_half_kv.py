"""kv_cache.dtype bf16 through the shipped binary: a CPU server holding its KV cache in 16 bits. /metrics names the
format (strata_kv_cache_info), counts the blocks the documented block format gives (16 entries of K and V for 3 KV
heads of 64, 2 bytes each: half an f32 block, so twice the blocks in the same kv_cache.memory_mib), and while a
request decodes shows every layer at that size; the request completes and gives its blocks back."""
import time

import pytest
import requests

from serve_process import ServeProcess
from support import ROOT, metric, metrics, tokenizer

N_LAYERS = 30
N_KV_HEADS, HEAD_DIM, BLOCK = 3, 64, 16
BF16_BLOCK_BYTES = 2 * N_KV_HEADS * BLOCK * HEAD_DIM * 2  # 12,288
F32_BLOCK_BYTES = 2 * BF16_BLOCK_BYTES
MEMORY_MIB = 64
PROMPT_TOKENS = 300


@pytest.fixture(scope="module")
def server():
    s = ServeProcess(["kv_cache.dtype=bf16", f"kv_cache.memory_mib={MEMORY_MIB}"], "strata serve (bf16 KV)")
    try:
        yield s.wait_ready()
    finally:
        s.stop()


def test_metrics_name_the_format_and_count_bf16_blocks(server):
    samples = metrics(server.base_url)
    assert metric(samples, "strata_kv_cache_info", dtype="bf16", element="bf16") == 1
    assert metric(samples, "strata_kv_blocks_total") == MEMORY_MIB * 2**20 // BF16_BLOCK_BYTES
    assert metric(samples, "strata_kv_blocks_total") > 2 * (MEMORY_MIB * 2**20 // F32_BLOCK_BYTES) - 2


def test_a_request_holds_its_layers_at_the_bf16_block_size(server):
    text = (ROOT / "tests" / "fixtures" / "texts" / "how_clocks_keep_time.txt").read_text(encoding="utf-8")
    ids = tokenizer().encode(text, add_special_tokens=False).ids[:PROMPT_TOKENS]
    body = {"model": "SmolLM2-135M-Instruct", "prompt": ids, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "stream": True}
    chunks, samples = 0, None
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                chunks += 1
                if chunks == 4:
                    samples = metrics(server.base_url)
    assert samples is not None, f"the stream ended after {chunks} chunks"
    for layer in range(N_LAYERS):
        tokens = metric(samples, "strata_kv_layer_tokens", layer=layer, pp_stage=0, tp_rank=0)
        assert PROMPT_TOKENS <= tokens <= PROMPT_TOKENS + 24
        held = metric(samples, "strata_kv_layer_bytes", layer=layer, pp_stage=0, tp_rank=0)
        assert held == -(-tokens // BLOCK) * BF16_BLOCK_BYTES, (layer, tokens, held)
    for _ in range(300):
        state = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
        if not state["sequences"] and state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]:
            return
        time.sleep(0.2)
    raise AssertionError(f"KV still held after the request ended: {state}")
