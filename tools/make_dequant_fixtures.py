#!/usr/bin/env python3
"""Writes the golden data for the C++ dequantization tests, computed by the independent gguf-py library.

tests/fixtures/dequant/<type>.blocks  raw blocks with random quants and small finite f16 scales
tests/fixtures/dequant/<type>.f32     their dequantization by gguf.quants.dequantize (little-endian float32)
tests/fixtures/dequant/smollm2_reference.json  a few dequantized rows of the real model (when it is present)

Run from the repository root: .venv/bin/python tools/make_dequant_fixtures.py
"""
import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the f16 scale fields in each block (../shared/specs/model_format.md, section 2).
SCALE_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
N_BLOCKS = 3


def random_blocks(qtype, rng):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(N_BLOCKS, block_bytes), dtype=np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        # Random bits in a scale field could be inf or NaN: use small finite halves instead.
        scales = (rng.standard_normal(N_BLOCKS) * 0.01).astype(np.float16)
        raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(N_BLOCKS, 2)
    return raw


def float_blocks(qtype, rng):
    if qtype == T.F16:
        values = (rng.standard_normal(64) * 4).astype(np.float16)
        values[:4] = np.array([6e-8, -3e-5, np.inf, -np.inf], dtype=np.float16)  # subnormals and infinities
        return values.view(np.uint8).reshape(1, -1)
    values = rng.standard_normal(64).astype(np.float32) * 100
    return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(1, -1)  # bf16: top halves


def write_type_fixtures(out_dir, rng):
    for qtype in [T.F16, T.BF16, *SCALE_FIELDS]:
        raw = float_blocks(qtype, rng) if qtype in (T.F16, T.BF16) else random_blocks(qtype, rng)
        values = dequantize(raw, qtype).astype("<f4").reshape(-1)
        assert np.isfinite(values).sum() >= values.size - 2, qtype.name
        name = qtype.name.lower()
        (out_dir / f"{name}.blocks").write_bytes(raw.tobytes())
        (out_dir / f"{name}.f32").write_bytes(values.tobytes())
        print(f"{name}: {raw.nbytes} bytes -> {values.size} values")


def write_model_reference(model_path, out_dir):
    reader = GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    picks = [("blk.0.attn_q.weight", [0, 575], None), ("blk.0.attn_k.weight", [5], 64),
             ("blk.29.ffn_down.weight", [0, 575], 64), ("token_embd.weight", [1, 49151], 64),
             ("blk.0.attn_norm.weight", [0], 16)]
    reference = {}
    for name, rows, n_values in picks:
        t = tensors[name]
        matrix = dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))
        reference[name] = {
            "type": t.tensor_type.name.lower(),
            "rows": {str(r): [float(v) for v in matrix[r][:n_values]] for r in rows},
        }
    lines = [f" {json.dumps(name)}: {json.dumps(entry)}" for name, entry in reference.items()]
    (out_dir / "smollm2_reference.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"smollm2_reference.json: {', '.join(reference)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/dequant")
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--seed", type=int, default=20240613)
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_type_fixtures(out_dir, np.random.default_rng(args.seed))
    if Path(args.model).exists():
        write_model_reference(args.model, out_dir)
    else:
        print(f"{args.model} is missing (run tools/setup.sh): smollm2_reference.json not written")


if __name__ == "__main__":
    main()
