"""`strata eval`'s RULER scores against what the model answers through the server ([eval-ruler]).

`strata eval --dump-ruler-prompts` writes each case's context and question as token ids; the shared `strata serve`
(the `full` cache) answers context + question greedily over HTTP, and RULER's recall is computed here from the answer
key. `full`'s rows of an eval on the same cases must hold those answers and scores in both settings: with the question
in the prompt the two paths are the same computation, and after compression (the question fed a token a step once the
context was prefilled) `full` has compressed nothing, so the only difference from the server's single prompt is
prefill against decode steps, which must not change a greedy answer here."""
import json
import subprocess

from serve_process import CONFIG, strata_binary
from support import ROOT

CASES = ["--ruler-tasks", "niah_single,niah_multivalue,variable_tracking", "--ruler-lengths", "700",
         "--ruler-trials", "1"]
NO_OTHER_TASK = ["--ppl-prefixes", "", "--long-docs", "0", "--retrieval-lengths", "", "--passkey-lengths", "",
                 "--agreement-prompts", "0"]


def strata_eval(*args):
    result = subprocess.run([str(strata_binary()), "eval", "--config", str(CONFIG), *CASES, *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


def recall(expected, answer):
    """RULER's string_match_all: the share of the expected values found in the answer, case-insensitively."""
    return sum(value.lower() in answer.lower() for value in expected) / len(expected)


def test_full_scores_what_the_servers_greedy_answer_gives_in_both_settings(tmp_path, client, model_name):
    prompts_path, results_path = tmp_path / "prompts.jsonl", tmp_path / "results.json"
    strata_eval("--dump-ruler-prompts", str(prompts_path))
    strata_eval("--out", str(results_path), "--policies", "", "--quantized", "", *NO_OTHER_TASK,
                "--set", "kv_cache.memory_mib=64")
    prompts = [json.loads(line) for line in prompts_path.read_text(encoding="utf-8").splitlines()]
    (full,) = json.loads(results_path.read_text(encoding="utf-8"))["cases"]
    scored = {(r["task"], r["length"], r["trial"], r["setting"]): r for r in full["ruler"]}
    assert len(scored) == 2 * len(prompts) == 6

    recalls = []
    for p in prompts:
        response = client.completions.create(model=model_name, prompt=p["context"] + p["question"],
                                             max_tokens=p["generate"], temperature=0)
        answer = response.choices[0].text
        recalls.append(recall(p["expected"], answer))
        for setting in ("in_prompt", "after_compression"):
            row = scored[p["task"], p["length"], p["trial"], setting]
            assert row["expected"] == p["expected"], (p["task"], setting)
            assert row["answer"] == answer, (p["task"], setting, row["answer"], answer)
            assert row["recall"] == recalls[-1], (p["task"], setting, row["recall"], recalls[-1])
    # The cases are not all trivially solved or all failed: the comparison covers both kinds of score.
    assert max(recalls) == 1.0 and min(recalls) < 1.0, recalls
