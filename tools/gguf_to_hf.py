#!/usr/bin/env python3
"""Converts a llama GGUF into a Hugging Face style directory: config.json and model.safetensors (F32).

Tensors are dequantized by gguf-py; the Q and K rows are un-permuted from the GGUF interleaved-RoPE layout back into
HF's half-split layout (../shared/specs/model_format.md, section 3). The safetensors file is written by hand
(u64 LE header length, JSON header, raw data), so nothing beyond numpy and gguf is needed.

Usage: .venv/bin/python tools/gguf_to_hf.py models/SmolLM2-135M-Instruct.Q4_1.gguf OUT_DIR [--layers N]
"""
import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

# GGUF name (with {} for the layer) -> HF name, per ../shared/specs/model_format.md section 3.
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def unpermute(w, n_heads):
    """GGUF row h*d + 2i + j holds HF row h*d + j*(d/2) + i."""
    rows, cols = w.shape
    head_dim = rows // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_config(reader, n_layers):
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"general.architecture is {arch!r}; only llama is supported")
    p = "llama."
    n_heads = int(field(reader, p + "attention.head_count"))
    d_model = int(field(reader, p + "embedding_length"))
    tensors = {t.name: t for t in reader.tensors}
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab = field(reader, p + "vocab_size") or (len(tokens) if tokens else int(tensors["token_embd.weight"].shape[1]))
    as_float = lambda x: float(str(np.float32(x)))  # the shortest decimal of the stored f32
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_name_or_path": field(reader, "general.name", "converted-gguf"),
        "hidden_size": d_model,
        "intermediate_size": int(field(reader, p + "feed_forward_length")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(field(reader, p + "attention.head_count_kv", n_heads)),
        "head_dim": int(field(reader, p + "attention.key_length", d_model // n_heads)),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(field(reader, p + "context_length")),
        "rms_norm_eps": as_float(field(reader, p + "attention.layer_norm_rms_epsilon")),
        "rope_theta": as_float(field(reader, p + "rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in tensors,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    for key, name in [("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id")]:
        if field(reader, key) is not None:
            config[name] = int(field(reader, key))
    return config


def hf_tensors(reader, config):
    """(HF name, HF shape, function returning the float32 array in HF layout), in file order."""
    tensors = {t.name: t for t in reader.tensors}

    def entry(hf_name, gguf_name, n_heads_to_unpermute=None):
        t = tensors[gguf_name]
        shape = [int(n) for n in reversed(t.shape)]  # GGUF lists ne[0] first; HF is outermost first

        def load():
            values = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
            return values if n_heads_to_unpermute is None else unpermute(values, n_heads_to_unpermute)
        return hf_name, shape, load

    yield entry("model.embed_tokens.weight", "token_embd.weight")
    for layer in range(config["num_hidden_layers"]):
        for gguf_name, hf_name in LAYER_NAMES.items():
            heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}.get(gguf_name)
            yield entry(f"model.layers.{layer}.{hf_name}.weight", f"blk.{layer}.{gguf_name}.weight", heads)
    yield entry("model.norm.weight", "output_norm.weight")
    if not config["tie_word_embeddings"]:
        yield entry("lm_head.weight", "output.weight")


def write_safetensors(path, entries):
    """Writes the header from the shapes first, then one tensor at a time (peak memory: one tensor)."""
    entries = list(entries)
    header, offset = {}, 0
    for name, shape, _ in entries:
        n_bytes = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n_bytes]}
        offset += n_bytes
    header["__metadata__"] = {"format": "pt"}
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # keeps the data 8-byte aligned, as the reference writer does
    with open(path, "wb") as out:
        out.write(np.uint64(len(header_bytes)).astype("<u8").tobytes())
        out.write(header_bytes)
        for name, shape, load in entries:
            values = np.ascontiguousarray(load(), dtype="<f4")
            assert list(values.shape) == shape, name
            out.write(values.tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("out_dir")
    parser.add_argument("--layers", type=int, help="keep only the first N layers (smaller files for tests)")
    args = parser.parse_args()
    reader = GGUFReader(args.gguf)
    total_layers = int(field(reader, "llama.block_count"))
    n_layers = total_layers if args.layers is None else min(args.layers, total_layers)
    config = hf_config(reader, n_layers)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(out / "model.safetensors", hf_tensors(reader, config))
    print(f"{out}: config.json and model.safetensors ({n_layers} of {total_layers} layers, F32)")


if __name__ == "__main__":
    main()
