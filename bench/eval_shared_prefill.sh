#!/usr/bin/env bash
# What shared prefill saves strata eval: the same grid run twice with this build, first with every row prefilling
# alone (--no-shared-prefill, what every eval did before), then shared, one after the other:
#
#   bench/eval_shared_prefill.sh [--out-dir bench/results] [--budgets 20%] [--name eval-grid-4096]
#
# --budgets 64,128,256,512,1024,10%,20%,50% --name eval-grid-4096-8-budgets is the whole grid of docs/eval/README.md
# but PoD (64 rows).
# The grid is the one of docs/eval at 4,096 tokens (two documents, 48 scored tokens, passkey at depth 0, two
# agreement prompts), every policy but PoD (which prefills alone either way), plus SimLayerKV on int4. Both
# JSON files keep their wall time and prefill count ("timing"); the ratio is printed and written beside them.
# Run it on an otherwise idle machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT_DIR=bench/results
BUDGETS=20%
NAME=eval-grid-4096
while (($#)); do
  case "$1" in
    --out-dir) OUT_DIR=$2; shift 2 ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "eval_shared_prefill.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done

grid=(build/strata eval --config configs/smollm2-cpu.yaml --set engine.threads=2 --set kv_cache.memory_mib=2048
      --policies streaming,h2o,snapkv,pyramidkv,simlayerkv,d2o,spindlekv --quantized simlayerkv
      --quantized-dtypes int4 --budgets "$BUDGETS" --documents alice_in_wonderland,around_the_world_in_80_days
      --ppl-prefixes 4096 --ppl-tokens 48 --long-docs 0 --retrieval-lengths "" --ruler-lengths "" --passkey-lengths 4096
      --passkey-depths 0
      --agreement-prompts 2 --agreement-context 1024 --agreement-tokens 24)
alone=$OUT_DIR/$NAME-alone.json
shared=$OUT_DIR/$NAME-shared.json
"${grid[@]}" --no-shared-prefill --out "$alone"
"${grid[@]}" --out "$shared"
.venv/bin/python - "$alone" "$shared" "$OUT_DIR/$NAME-ratio.json" --budgets "$BUDGETS" --name "$NAME" <<'PY'
import json, sys
alone, shared = (json.load(open(p)) for p in sys.argv[1:3])
a, s = alone["timing"], shared["timing"]
# Batches differ between the two runs, and a batch's matmuls round a row differently (docs/decisions.md
# [eval-frontier]): the scores agree to rounding, the answers nearly always exactly.
nll_diff = max(abs(p["mean_nll"] - q["mean_nll"]) for x, y in zip(alone["cases"], shared["cases"])
               for p, q in zip(x["perplexity"], y["perplexity"]))
answers = [(p["answer"] == q["answer"]) for x, y in zip(alone["cases"], shared["cases"])
           for p, q in zip(x.get("passkey", []), y.get("passkey", []))]
out = {"command": " ".join(["bench/eval_shared_prefill.sh"] + sys.argv[4:]), "machine": shared["machine"],
       "alone": a, "shared": s,
       "speedup": a["wall_seconds"] / s["wall_seconds"], "rows": len(shared["cases"]),
       "max_mean_nll_difference": nll_diff, "passkey_answers_equal": sum(answers), "passkey_answers": len(answers)}
json.dump(out, open(sys.argv[3], "w"), indent=1)
print(f"alone {a['wall_seconds']:.0f} s ({a['prefills']} prefills), shared {s['wall_seconds']:.0f} s "
      f"({s['prefills']} prefills): {out['speedup']:.2f}x; largest mean NLL difference {nll_diff:.2e}; "
      f"passkey answers equal {sum(answers)}/{len(answers)}")
PY
