#!/usr/bin/env python3
"""Where KVzip's own scores rank the values a RULER question asks for, computed without Strata: the question of
docs/eval/ruler/ whether KVzip's needle scores on SmolLM2-135M come from the method or from Strata's code.

The cases are the eval's (token ids written by `strata eval --dump-ruler-prompts`); for each, Hugging Face
transformers on models/SmolLM2-135M-Instruct.Q4_1.gguf scores the context as KVzip defines it
(tools/make_reference_selections.py, kvzip_scores: the context as one chunk, its reconstruction appended, the max
over the reconstruction rows and a KV head's query heads of the attention probabilities), and the script finds the
expected values' digit tokens in the context. Per case it writes, per layer and KV head, the share of the context
that scores above the value's lowest-scoring token, and how many of the 90 (layer, KV head) pairs keep every value
token under a cut to 25% of the context: the same count in every head (Strata's kvzip, design rule 2) and one
threshold over all layers and heads (kvpress's KVzipPress default).

    build/strata eval --config configs/smollm2-cpu.yaml --dump-ruler-prompts /tmp/ruler.jsonl \\
        --ruler-tasks niah_single,niah_multikey,niah_multiquery --ruler-lengths 2048 --ruler-trials 2
    nice /tmp/refvenv/bin/python tools/kvzip_needle_ranks.py /tmp/ruler.jsonl --out docs/eval/ruler/kvzip-needle-ranks.json

Needs the reference stack (tools/requirements-reference.txt).
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_reference_selections as ref  # noqa: E402
from reference_tokenizer import build_reference_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SINKS = 4


def value_positions(context, value_ids):
    """The positions of every occurrence of value_ids in context."""
    n = len(value_ids)
    return [p for i in range(len(context) - n + 1) if context[i:i + n] == value_ids for p in range(i, i + n)]


def kept_by_cut(scores, positions, share):
    """(pairs keeping every position with the same count per KV head, and with one threshold over all of them)."""
    n = scores[0].shape[-1]
    keep = int(share * n)
    stacked = torch.stack(scores).clone()  # [layers, kv heads, n]
    stacked[..., :SINKS] = float("inf")
    uniform = sum(all(p in set(torch.topk(head, keep).indices.tolist()) for p in positions)
                  for layer in stacked for head in layer)
    threshold = torch.sort(stacked.reshape(-1), descending=True).values[keep * stacked.shape[0] * stacked.shape[1] - 1]
    global_cut = sum(all(float(head[p]) >= float(threshold) for p in positions) for layer in stacked for head in layer)
    return uniform, global_cut


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases")
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--share", type=float, default=0.25)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model_path = Path(args.model)
    tokenizer = build_reference_tokenizer(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                 dtype=torch.float32, attn_implementation="eager").eval()
    answer_start = ref.answer_start_text(model_path)
    out = []
    for line in Path(args.cases).read_text().splitlines():
        case = json.loads(line)
        context = case["context"]
        positions = sorted({p for v in case["expected"]
                            for p in value_positions(context, tokenizer.encode(v, add_special_tokens=False).ids)})
        assert positions, f"{case['task']} trial {case['trial']}: no value found in the context"
        scoring, _, _ = ref.kvzip_scoring_ids(tokenizer, context, answer_start)
        scores, _ = ref.kvzip_scores(model, context, scoring, [])
        above = [[round(float((head > min(float(head[p]) for p in positions)).float().mean()), 3) for head in layer]
                 for layer in scores]
        uniform, global_cut = kept_by_cut(scores, positions, args.share)
        out.append({"task": case["task"], "length": case["length"], "trial": case["trial"], "n": len(context),
                    "value_positions": positions, "share": args.share,
                    "pairs_keeping_every_value_token": {"same_count_per_head": uniform, "one_threshold": global_cut},
                    "share_above_lowest_value_token": above})
        print(f"{case['task']} trial {case['trial']}: {len(positions)} value tokens; of 90 (layer, KV head) pairs at "
              f"{args.share:.0%}, {uniform} keep them all with the same count per head, {global_cut} with one "
              f"threshold", flush=True)
    report = {"what": "KVzip's scores (transformers, the paper's definition) of the RULER values' tokens",
              "command": "python " + " ".join(sys.argv), "model": model_path.name,
              "per_case": out}  # not "cases": tests/eval/test_eval_report.py reads every eval file that has them
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
