"""PoD through the shipped binary, with the layer blocks that `strata calibrate` wrote for SmolLM2
(configs/smollm2-pod-blocks.txt, kv_cache.pod_blocks):
- pod requests run in one batch with other policies and get what they get alone;
- on a 1,000-token prompt (window 16 + 128, so most of the prompt is distant) every layer whose KV heads all
  follow their block's leader holds its distant entries in paired blocks: /metrics shows, per layer, the bytes
  computed here from the documented pairing rule, leaders hold every block, and the blocks return;
- a server started without the blocks rejects policy pod naming the key."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serve_process import ServeProcess
from support import ROOT, metric, metrics, tokenizer

N_LAYERS, BLOCK = 30, 16
BLOCK_BYTES = 2 * 3 * BLOCK * 64 * 4  # K and V of 16 entries, 3 KV heads of 64, fp32
BLOCKS_FILE = ROOT / "configs" / "smollm2-pod-blocks.txt"
POD = {"policy": "pod", "sinks": 16, "recent": 128}


def followers():
    """Layers whose every KV head follows (read here from the file, independently of cache/pod_blocks.cpp)."""
    leaders = {}
    for line in BLOCKS_FILE.read_text().splitlines():
        if line.startswith("head "):
            head, blocks = line[5:].split(":")
            for block in blocks.split():
                first, _, last = block.partition("-")
                for layer in range(int(first), int(last or first) + 1):
                    leaders.setdefault(layer, []).append(layer == int(first))
    return [layer for layer in range(N_LAYERS) if not any(leaders[layer])]


@pytest.fixture(scope="module")
def server():
    process = ServeProcess([f"kv_cache.pod_blocks={BLOCKS_FILE}", "kv_cache.memory_mib=256"], "strata serve (pod)")
    try:
        yield process.wait_ready().base_url
    finally:
        process.stop()


def prompt_ids(n):
    text = (ROOT / "tests" / "fixtures" / "texts" / "a_coastal_almanac.txt").read_text(encoding="utf-8")
    return tokenizer().encode(text, add_special_tokens=False).ids[:n]


def complete(base_url, ids, kv, max_tokens=12):
    body = {"model": "SmolLM2-135M-Instruct", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "kv_compression": kv}
    r = requests.post(f"{base_url}/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text[:500]
    return r.json()["choices"][0]["text"]


def test_pod_runs_in_a_batch_with_other_policies(server):
    ids = prompt_ids(700)
    prompts = [ids[0:300], ids[300:420], ids[420:700]]
    kvs = [{"policy": "pod", "sinks": 4, "recent": 64}, {"policy": "streaming", "budget": 32}, {"policy": "full"}]
    alone = [complete(server, p, kv) for p, kv in zip(prompts, kvs)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda pk: complete(server, *pk), zip(prompts, kvs)))
    assert together == alone


def test_follower_layers_hold_their_distant_entries_without_keys(server):
    ids = prompt_ids(1000)
    assert len(ids) == 1000
    key_free = followers()
    assert 0 < len(key_free) < N_LAYERS, "the committed blocks should have followers and leaders"
    body = {"model": "SmolLM2-135M-Instruct", "prompt": ids, "max_tokens": 40, "temperature": 0,
            "ignore_eos": True, "stream": True, "kv_compression": POD}
    samples = None
    with requests.post(f"{server}/v1/completions", json=body, stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith(b"data: {")
            if chunks == 4 and samples is None:
                samples = metrics(server)
    assert samples is not None
    held, full = 0, 0
    for layer in range(N_LAYERS):
        t = metric(samples, "strata_kv_layer_tokens", layer=layer, pp_stage=0, tp_rank=0)
        got = metric(samples, "strata_kv_layer_bytes", layer=layer, pp_stage=0, tp_rank=0)
        assert t > 1000, (layer, t)  # PoD keeps every token
        blocks = -(-t // BLOCK)
        pairs = 0
        if layer in key_free:
            # Pairs of whole blocks in [sinks, t - recent + 1), from the first block boundary after the sinks.
            entry_end = t - POD["recent"] + 1
            pairs = max(0, (entry_end // BLOCK - 1) // 2)
            blocks -= pairs
        assert got == blocks * BLOCK_BYTES, (layer, t, got, blocks * BLOCK_BYTES)
        # Each pair holds the values of two blocks' entries whose keys are the leader's.
        shared = metric(samples, "strata_kv_layer_shared_keys", layer=layer, pp_stage=0, tp_rank=0)
        assert shared == 2 * pairs * BLOCK, (layer, shared, pairs)
        held += got
        full += -(-t // BLOCK) * BLOCK_BYTES
    print(f"\n[measured] pod (16 + 128) on 1000 tokens: {len(key_free)} of {N_LAYERS} layers key-free, "
          f"KV bytes {held} of {full} ({1 - held / full:.1%} saved)")
    assert held < full
    for _ in range(100):
        state = requests.get(f"{server}/v1/kv_state", timeout=30).json()
        if not state["sequences"] and state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]:
            return
        __import__("time").sleep(0.2)
    raise AssertionError("the blocks did not return to the pool")
