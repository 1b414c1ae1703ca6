"""strata bench with dummy weights on the CPU (preset tiny-gqa: 6 layers, 4 KV heads of 32, f32): decoding at a
synthetic context (--context), the bandwidth account of a decode step (and with bf16 weights), cells that do not
fit, a policy deciding at the synthetic prompt's end, and the preset's layer override (docs/gpu.md)."""
import json
import os
import subprocess

import pytest

from support import ROOT
from test_build_commit import expected_cpu_kernels

LAYERS, D, KV_WIDTH, D_FF, VOCAB = 6, 256, 4 * 32, 768, 4096
ENTRY_BYTES = 2 * KV_WIDTH * 4  # one layer's key and value of one entry, f32
LAYER_PARAMETERS = D * (D + 2 * KV_WIDTH) + D * D + 3 * D_FF * D + 2 * D
WEIGHT_BYTES = 4 * (LAYERS * LAYER_PARAMETERS + VOCAB * D + D)  # the layers, the output head and its norm


def bench(tmp_path, *args, check=True):
    binary = os.environ.get("STRATA_BIN", "build/strata")
    out = tmp_path / "bench.json"
    done = subprocess.run([str(ROOT / binary) if not os.path.isabs(binary) else binary, "bench",
                           "--config", "configs/smollm2-cpu.yaml", "--set", "engine.threads=1",
                           "--set", "kv_cache.memory_mib=8", *args, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    if not check:
        return done
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_context_decodes_after_synthetic_entries_and_accounts_its_bytes(tmp_path):
    report = bench(tmp_path, "--model", "preset:tiny-gqa", "--context", "256,1500,4096", "--batch", "1,2",
                   "--prompt-tokens", "16", "--gen-tokens", "4", "--copy-bandwidth-gbs", "10")
    assert report["weight_dtype"] == "auto"  # the preset's dummy weights are f32 under auto: 4 bytes each
    # engine.activation_dtype auto, decided for the machine
    assert report["activations"] == ("f32" if expected_cpu_kernels() == "baseline" else "int16")
    assert report["kv_pool"]["entry_bytes_per_layer"] == ENTRY_BYTES
    rows = {(r["context"], r["batch"]): r for r in report["results"]}
    assert len(rows) == 6
    for batch in (1, 2):
        row = rows[(256, batch)]
        assert row["context_kind"] == "synthetic"
        assert (row["synthetic_entries"], row["prefilled_tokens"], row["decode_steps"]) == (240, 16, 3)
        account = row["bandwidth"]
        assert account["weight_bytes_per_step"] == WEIGHT_BYTES
        # Decode step g (1..3) reads the 256 + g - 1 entries held and its new one, in every layer.
        assert account["kv_bytes_per_step"] == batch * LAYERS * 258 * ENTRY_BYTES
        assert account["achieved_gbs"] == pytest.approx(account["bytes_per_step"] / account["seconds_per_step"] / 1e9)
        assert account["fraction_of_copy_bandwidth"] == pytest.approx(account["achieved_gbs"] / 10)
        assert row["decode_tokens_per_second"] > 0
    # 8 MiB hold 512 blocks of 16 entries: 1,500 entries in 6 layers need 564; tiny-gqa's context is 2,048.
    assert "KV blocks" in rows[(1500, 1)]["skipped"]
    assert "context" in rows[(4096, 2)]["skipped"]


def test_bf16_weights_take_half_the_bytes_and_the_start_up_line_says_so(tmp_path):
    done = bench(tmp_path, "--model", "preset:tiny-gqa", "--batch", "1", "--prompt-tokens", "16", "--gen-tokens", "4",
                 "--set", "model.weight_dtype=bf16", check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    norms = LAYERS * 2 * D + D  # f32 whatever model.weight_dtype says
    per_step = 2 * (WEIGHT_BYTES // 4 - norms) + 4 * norms
    assert report["results"][0]["bandwidth"]["weight_bytes_per_step"] == per_step
    held = per_step + 2 * VOCAB * D  # and the token embedding (not tied in this preset)
    assert f", weights {(held + 2**19) // 2**20} MiB, KV pool of " in done.stderr


def test_a_policy_decides_over_the_synthetic_entries(tmp_path):
    report = bench(tmp_path, "--model", "preset:tiny-gqa", "--context", "512", "--batch", "2", "--prompt-tokens",
                   "32", "--gen-tokens", "4", "--policy", "snapkv:budget=64")
    row = report["results"][0]
    # SnapKV keeps 64 entries per layer at the prompt's end, then each step adds one.
    assert row["bandwidth"]["kv_bytes_per_step"] == 2 * LAYERS * (64 + 2) * ENTRY_BYTES


def test_without_context_the_engine_run_has_an_estimated_account(tmp_path):
    report = bench(tmp_path, "--model", "preset:tiny-gqa", "--batch", "2", "--prompt-tokens", "32",
                   "--gen-tokens", "5")
    account = report["results"][0]["bandwidth"]
    assert account["weight_bytes_per_step"] == WEIGHT_BYTES
    assert account["kv_bytes_per_step"] == 2 * LAYERS * (32 + 2.5) * ENTRY_BYTES
    assert "kv_bytes_estimated" in account


def test_preset_layers_override(tmp_path):
    report = bench(tmp_path, "--model", "preset:tiny-gqa@layers=2", "--context", "64", "--batch", "1",
                   "--prompt-tokens", "8", "--gen-tokens", "2")
    assert report["model"]["layers"] == 2
    failed = bench(tmp_path, "--model", "preset:tiny-gqa@layers=7", "--batch", "1", check=False)
    assert failed.returncode == 1
    assert "layers" in failed.stderr and "from 1 to 6" in failed.stderr
