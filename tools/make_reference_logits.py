"""Writes the independent reference fixtures in tests/fixtures/reference/ (format: that folder's README.md).

The reference is Hugging Face transformers loading the same GGUF file: it dequantizes every tensor to fp32 and
undoes the GGUF Q/K row permutation (../shared/specs/model_format.md, section 7), so it shares no code with Strata.
Prompts are tokenized with tools/reference_tokenizer.py, never with transformers' GGUF tokenizer conversion,
which lacks SmolLM2's digit splitting; the model is fed token ids.

Needs the reference stack (tools/requirements-reference.txt, plus accelerate, which transformers wants for GGUF).
CI never runs this; rerun it by hand when a prompt changes and commit the output:

    nice -n 10 python tools/make_reference_logits.py
"""
import argparse
import json
import os
import shlex
import struct
import sys
from importlib.metadata import version
from pathlib import Path

import gguf
import jinja2
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tokenizer import build_reference_tokenizer  # noqa: E402
from file_digest import sha256  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOPK = 16
GREEDY_STEPS = 64
LONG_MIN_TOKENS = 1100

SHORT_TEXT = "The old lighthouse keeper climbed the stairs every evening to light the lamp, and"

CODE_TEXT = (
    "In 2023 the team measured 1,234 requests per second on 8 cores (about 154.25 each).\n"
    "def fib(n):\n"
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
    "\n"
    "print([fib(i) for i in range(10)])  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n"
    "The function above returns fib(20) = 6765, and fib(30) ="
)

CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def chat_template(reader):
    field = reader.fields["tokenizer.chat_template"]
    return field.contents()


def long_text_prefix(tokenizer, text, min_tokens):
    """The shortest prefix of text that ends a sentence and has at least min_tokens tokens."""
    end = 0
    while True:
        end = text.find(". ", end + 1)
        if end < 0:
            raise ValueError(f"the long text has fewer than {min_tokens} tokens")
        prefix = text[:end + 1]
        if len(tokenizer.encode(prefix, add_special_tokens=False).ids) >= min_tokens:
            return prefix


def greedy(model, prompt_ids, steps):
    """Greedy continuation with the HF KV cache; returns the ids and the top1 - top2 margin at each step."""
    ids, margins = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        for _ in range(steps):
            top = out.logits[0, -1].topk(2)
            next_id = int(top.indices[0])
            ids.append(next_id)
            margins.append(float(top.values[0] - top.values[1]))
            out = model(torch.tensor([[next_id]]), past_key_values=out.past_key_values, use_cache=True)
    return ids, margins


def write_topk(path, logits):
    """T * (16 int32 ids, 16 float32 logits), little-endian, descending logits per position."""
    top = logits.topk(TOPK, dim=-1)
    with open(path, "wb") as f:
        for t in range(logits.shape[0]):
            f.write(struct.pack(f"<{TOPK}i", *top.indices[t].tolist()))
            f.write(struct.pack(f"<{TOPK}f", *top.values[t].tolist()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--long-text", default=str(ROOT / "tests/fixtures/texts/the_keepers_ledger.txt"))
    parser.add_argument("--out", default=str(ROOT / "tests/fixtures/reference"))
    args = parser.parse_args()

    model_path = Path(args.model)
    if not model_path.exists():
        sys.exit(f"{model_path} is missing: run tools/setup.sh to fetch it")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    tokenizer = build_reference_tokenizer(str(model_path))
    reader = gguf.GGUFReader(str(model_path))

    rendered_chat = jinja2.Environment().from_string(chat_template(reader)).render(
        messages=CHAT_MESSAGES, add_generation_prompt=True)
    long_text = long_text_prefix(tokenizer, Path(args.long_text).read_text(encoding="utf-8"), LONG_MIN_TOKENS)
    # (name, fields describing the source, text to tokenize); encode() parses special-token strings, which only
    # the rendered chat contains.
    prompts = [
        ("short_text", {"text": SHORT_TEXT}, SHORT_TEXT),
        ("chat_capital", {"messages": CHAT_MESSAGES, "rendered": rendered_chat}, rendered_chat),
        ("code_digits", {"text": CODE_TEXT}, CODE_TEXT),
        ("long_text", {"text": long_text, "source": "tests/fixtures/texts/the_keepers_ledger.txt (prefix)"},
         long_text),
    ]

    # eager attention: the plain softmax(QK^T)V formula, in fp32.
    model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                 dtype=torch.float32, attn_implementation="eager").eval()
    versions = {package: version(package) for package in ("torch", "transformers", "gguf", "tokenizers")}
    versions["python"] = sys.version.split()[0]
    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    model_info = {"file": model_path.name, "sha256": sha256(model_path)}

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, source, text in prompts:
        prompt_ids = tokenizer.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids])).logits[0].float()
        greedy_ids, greedy_margins = greedy(model, prompt_ids, GREEDY_STEPS)
        write_topk(out_dir / f"{name}.topk.bin", logits)
        record = {"name": name, **source, "prompt_ids": prompt_ids, "greedy_ids": greedy_ids,
                  "greedy_margins": greedy_margins, "greedy_text": tokenizer.decode(greedy_ids,
                                                                                    skip_special_tokens=False),
                  "topk": TOPK, "model": model_info, "versions": versions, "command": command}
        # One top-level key per line, each value on one line: small, and diffs stay readable.
        lines = [f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}" for key, value in record.items()]
        (out_dir / f"{name}.json").write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
        print(f"{name}: {len(prompt_ids)} prompt tokens, greedy {tokenizer.decode(greedy_ids)!r}, "
              f"min margin {min(greedy_margins):.4f}")


if __name__ == "__main__":
    main()
