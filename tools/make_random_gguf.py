"""A Llama-architecture GGUF with random weights, in F16, at shapes whose rows are multiples of 256 (the k-quants'
super-block: SmolLM2-135M's 576 is not one, so llama-quantize leaves its matrices in other formats), with SmolLM2's
tokenizer and chat template. llama-quantize turns it into Q4_K_M, the file the k-quant kernels are compared on
against llama.cpp (bench/cpu_vs_llamacpp.sh --model); speed does not depend on the values.

    .venv/bin/python tools/make_random_gguf.py --out /tmp/random-1024.f16.gguf
    build-llamacpp/build-0.3.36/bin/llama-quantize /tmp/random-1024.f16.gguf /tmp/random-1024.q4_k_m.gguf Q4_K_M
"""
import argparse
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SHAPE_KEYS = {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
              "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
              "general.file_type", "general.name", "general.size_label"}


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter):
    """Every key of the source but its shapes and name (the tokenizer, the chat template, RoPE, the norms' eps)."""
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in SHAPE_KEYS:
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=2816)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for name in ("hidden", "ffn"):
        if getattr(args, name) % 256:
            parser.error(f"--{name} must be a multiple of 256 (a k-quant super-block)")
    head_dim = args.hidden // args.heads

    reader = gguf.GGUFReader(SOURCE)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(args.out, "llama")
    writer.add_name(f"random llama {args.hidden}x{args.layers}")
    writer.add_block_count(args.layers)
    writer.add_embedding_length(args.hidden)
    writer.add_feed_forward_length(args.ffn)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    copy_metadata(reader, writer)

    rng = np.random.default_rng(args.seed)

    def matrix(rows, cols):  # (out, in), as GGUF stores a [cols, rows] tensor
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    kv = args.kv_heads * head_dim
    writer.add_tensor("token_embd.weight", matrix(vocab, args.hidden))  # tied: also the output head
    for layer in range(args.layers):
        blk = f"blk.{layer}."
        writer.add_tensor(blk + "attn_norm.weight", np.ones(args.hidden, dtype=np.float32))
        writer.add_tensor(blk + "attn_q.weight", matrix(args.hidden, args.hidden))
        writer.add_tensor(blk + "attn_k.weight", matrix(kv, args.hidden))
        writer.add_tensor(blk + "attn_v.weight", matrix(kv, args.hidden))
        writer.add_tensor(blk + "attn_output.weight", matrix(args.hidden, args.hidden))
        writer.add_tensor(blk + "ffn_norm.weight", np.ones(args.hidden, dtype=np.float32))
        writer.add_tensor(blk + "ffn_gate.weight", matrix(args.ffn, args.hidden))
        writer.add_tensor(blk + "ffn_up.weight", matrix(args.ffn, args.hidden))
        writer.add_tensor(blk + "ffn_down.weight", matrix(args.hidden, args.ffn))
    writer.add_tensor("output_norm.weight", np.ones(args.hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
