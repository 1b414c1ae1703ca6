"""`strata eval` through the shipped binary: which rows a command line asks for. A tiny perplexity task
(EVAL_TINY_TASK) keeps each run to seconds; the rows' numbers are the eval's own tests' business (tests/eval/)."""
import json
import subprocess

from serve_process import CONFIG, strata_binary
from support import EVAL_TINY_TASK, ROOT



def run_eval(tmp_path, *args):
    out = tmp_path / "results.json"
    result = subprocess.run([str(strata_binary()), "eval", "--config", str(CONFIG), "--out", str(out), *EVAL_TINY_TASK,
                             *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return result, out


def labels(out, key="label"):
    return [case[key] for case in json.loads(out.read_text(encoding="utf-8"))["cases"]]


def test_an_empty_policy_list_runs_only_full_and_the_quantized_rows(tmp_path):
    result, out = run_eval(tmp_path, "--policies", "", "--budgets", "50%", "--quantized", "full,snapkv",
                           "--quantized-dtypes", "int4")
    assert result.returncode == 0, result.stderr[-2000:]
    assert labels(out) == ["full", "full+int4", "snapkv@50%+int4"]
    # kv_cache.prefill_compression auto: full keeps every entry (end), SnapKV has the chunked form.
    assert labels(out, "prefill_compression") == ["end", "end", "chunked"]


def test_listed_policies_get_their_full_precision_rows(tmp_path):
    result, out = run_eval(tmp_path, "--policies", "streaming", "--budgets", "50%", "--quantized", "")
    assert result.returncode == 0, result.stderr[-2000:]
    assert labels(out) == ["full", "streaming@50%"]
    assert labels(out, "prefill_compression") == ["end", "chunked"]


def test_without_policies_every_policy_runs_and_pod_asks_for_its_blocks(tmp_path):
    """The default is every policy, PoD among them, which needs the blocks of `strata calibrate`: the run stops
    before the model loads, naming the key."""
    result, out = run_eval(tmp_path, "--budgets", "50%", "--quantized", "")
    assert result.returncode != 0
    assert "kv_cache.pod_blocks" in result.stderr
    assert not out.exists()


def test_the_retrieval_prompts_are_dumped_for_the_probe_without_running_a_case(tmp_path):
    """--dump-retrieval-prompts writes one JSON line per case (tools/retrieval_probe.py reads them) and runs no case,
    so the default policy list's PoD does not ask for its blocks."""
    prompts = tmp_path / "prompts.jsonl"
    result = subprocess.run([str(strata_binary()), "eval", "--config", str(CONFIG), "--dump-retrieval-prompts",
                             str(prompts), "--retrieval-lengths", "600,900", "--retrieval-depths", "0,1",
                             "--retrieval-trials", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "prompts written" in result.stderr
    lines = [json.loads(line) for line in prompts.read_text(encoding="utf-8").splitlines()]
    assert [(p["length"], p["depth"], p["trial"]) for p in lines] == [
        (length, depth, trial) for length in (600, 900) for depth in (0, 1) for trial in (0, 1)]
    for p in lines:
        assert abs(len(p["prompt"]) - p["length"]) < 60 and p["generate"] > 0 and p["expected"]


def test_data_needs_only_the_files_of_the_tasks_run(tmp_path):
    """RULER alone reads the two novels of its filler: no documents.txt, no instructions.txt in --data."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("alice_in_wonderland.txt", "around_the_world_in_80_days.txt"):
        (data / name).write_bytes((ROOT / "eval" / "data" / name).read_bytes())
    out = tmp_path / "results.json"
    result = subprocess.run([str(strata_binary()), "eval", "--config", str(CONFIG), "--out", str(out), "--data",
                             str(data), "--policies", "", "--quantized", "", "--ppl-prefixes", "", "--long-docs", "0",
                             "--retrieval-lengths", "", "--passkey-lengths", "", "--agreement-prompts", "0",
                             "--ruler-tasks", "niah_single", "--ruler-lengths", "300", "--ruler-trials", "1",
                             "--set", "kv_cache.memory_mib=64"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    (full,) = json.loads(out.read_text(encoding="utf-8"))["cases"]
    assert [(r["task"], r["setting"]) for r in full["ruler"]] == [("niah_single", "in_prompt"),
                                                                  ("niah_single", "after_compression")]


def test_an_unknown_ruler_task_or_setting_is_refused_with_the_known_names(tmp_path):
    for flag, value, known in (("--ruler-tasks", "niah_single,haystack", "niah_single, niah_multikey"),
                               ("--ruler-settings", "after_question", "in_prompt, after_compression")):
        result, out = run_eval(tmp_path, flag, value)
        assert result.returncode != 0 and not out.exists()
        unknown = value.split(",")[-1]
        assert f"{flag}: unknown name '{unknown}' (known: {known}" in result.stderr, result.stderr[-2000:]
