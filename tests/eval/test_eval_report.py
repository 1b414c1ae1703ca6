"""tools/eval_report.py: results in the older format (fixtures/, cut from an earlier docs/eval) still render with
every number recomputed from the raw scores, every committed result's intervals hold their estimates, and on
hand-built results in the newer format the bootstrap intervals, the Pareto front, the best row at 10x, the goal,
retrieval against `full`, the merging of files (task by task) and the timing come out as computed by hand."""
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLD_FORMAT = [ROOT / "tests" / "eval" / "fixtures" / name for name in ("old-format.json", "old-format-2.json")]
# Every committed `strata eval` result (the files with cases; a report names its inputs as it likes).
COMMITTED = [p for p in sorted((ROOT / "docs" / "eval").glob("**/*.json")) if "cases" in json.loads(p.read_text())]

_spec = importlib.util.spec_from_file_location("eval_report", ROOT / "tools" / "eval_report.py")
er = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(er)

FULL_NLL = {("alice", 2048): 3.0, ("alice", 4096): 2.9, ("verne", 2048): 2.8, ("verne", 4096): 2.7}
FULL_LONG_NLL = {"alice": 3.1, "verne": 2.95}


def make_case(policy, budget="", ratio=1.0, ppl=0.0, long=0.0, retrieval=None, dtype="f32", nll=None):
    """A case whose perplexity (and long-generation perplexity) is `full`'s times 1 + ppl (1 + long), for every
    document and prefix unless `nll` gives the mean NLLs; retrieval: [(length, depth, correct)]."""
    nll = nll or {key: v + math.log1p(ppl) for key, v in FULL_NLL.items()}
    case = {
        "policy": policy, "budget": budget, "kv_dtype": dtype, "example_spec": f"{policy}:{budget}", "seconds": 1.0,
        "perplexity": [{"document": d, "prefix": p, "tokens": 48, "mean_nll": v, "perplexity": math.exp(v)}
                       for (d, p), v in nll.items()],
        "long_generation": [{"document": d, "prefix": 128, "tokens": 1024, "mean_nll": v + math.log1p(long),
                             "perplexity": math.exp(v + math.log1p(long))} for d, v in FULL_LONG_NLL.items()],
        "retrieval": [{"length": n, "depth": d, "expected": "42", "answer": "42" if ok else "7", "correct": ok}
                      for n, d, ok in (retrieval or [])],
        "passkey": [], "agreement": [],
        "memory": {"bytes": [100] * 4, "uncompressed_bytes": [int(100 * ratio)] * 4, "ratio": ratio,
                   "longest_prompt": 4096, "longest_entries": [int(4096 / ratio)] * 4},
    }
    case["label"] = er.case_label(case)
    return case


FULL_RETRIEVAL = [(1000, 0.0, True), (1000, 0.5, True), (1000, 1.0, True),
                  (2000, 0.0, True), (2000, 0.5, False), (2000, 1.0, True)]


def make_run(cases, timing=None, **settings):
    run = {
        "command": "strata eval --synthetic", "machine": {"cpu": "test", "hardware_threads": 2}, "backend": "cpu",
        "model": {"path": "m.gguf", "name": "test-model", "layers": 4}, "kv_pool": {"memory_mib": 1, "block_size": 16},
        "settings": {"policies": sorted({c["policy"] for c in cases}), "budgets": [], "quantized_policies": [],
                     "quantized_dtype": "int4", "documents": ["alice", "verne"], "perplexity_prefixes": [2048, 4096],
                     "perplexity_tokens": 48, **settings},
        "cases": [make_case("full", retrieval=FULL_RETRIEVAL)] + cases,
    }
    if timing:
        run["timing"] = dict(zip(("wall_seconds", "shared_prefill", "prefills"), timing))
    return run


def rows_of(*runs):
    return er.collect_rows(list(runs), ["results.json"] + [f"results-{i + 2}.json" for i in range(len(runs) - 1)])


def by_name(rows):
    return {r.name: r for r in rows}


def write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def section(text, title):
    return text.split(f"## {title}")[1].split("\n## ")[0]


def test_old_format_still_renders(tmp_path):
    er.main([*map(str, OLD_FORMAT), "--out", str(tmp_path), "--layer-budget", "64"])
    text = (tmp_path / "README.md").read_text()
    cases = [c for path in OLD_FORMAT for c in json.loads(path.read_text())["cases"]]
    assert not any("label" in c or "retrieval" in c or "long_generation" in c for c in cases)
    rows = [line for line in section(text, "Every row").splitlines() if line.startswith("| ") and "×" in line]
    assert len(rows) == len(cases) - 1  # the two files measured `full` alike: one row
    assert sum(r.startswith("| full |") for r in rows) == 1
    for name in ("quality_vs_memory.png", "pareto_front.png", "layer_occupancy.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    assert not (tmp_path / "retrieval_by_depth.png").exists()
    assert "retrieval not measured" in section(text, "The goal")
    # Two documents: the percentile bootstrap spans just their range, the t-interval is honest about n = 2.
    assert "| simlayerkv@20%+int4 | -0.91% [-1.85%, +0.03%] | [-12.86%, +11.04%] | [-1.85%, +0.03%] | – | – | 0% |" \
        in section(text, "Every row")
    assert "## Perplexity increase per prefix length" not in text  # one prefix length only

    full = next(c for c in cases if c["policy"] == "full")
    case = next(c for c in cases if c["policy"] == "snapkv" and c["budget"] == "64")
    ref = {(p["document"], p["prefix"]): p["mean_nll"] for p in full["perplexity"]}
    inc = [math.exp(p["mean_nll"] - ref[(p["document"], p["prefix"])]) - 1 for p in case["perplexity"]]
    row = next(r for r in rows if r.startswith("| snapkv@64 |"))
    assert f"| {100 * sum(inc) / len(inc):+.2f}% [{100 * min(inc):+.2f}%, {100 * max(inc):+.2f}%] |" in row
    mem = case["memory"]
    assert f"{sum(mem['uncompressed_bytes']) / sum(mem['bytes']):.2f}×" in row


def test_every_committed_interval_contains_its_estimate():
    rows = [r for path in COMMITTED for r in rows_of(json.loads(path.read_text()))]
    estimates = [e for r in rows for e in [r.stats["ppl"], r.stats["long_generation"],
                                           *r.stats["ppl_by_prefix"].values()] if e is not None]
    scored = [r for r in rows if r.stats["ppl"] is not None or r.stats["long_generation"] is not None]
    assert len(estimates) >= len(scored) > 0  # a RULER-only file's rows have no estimate
    assert all(e.low <= e.value <= e.high for e in estimates)
    assert any(e.low < e.high for e in estimates)


def test_bootstrap_of_identical_documents_has_zero_width():
    assert er.bootstrap_mean([0.05, 0.05, 0.05]) == pytest.approx((0.05, 0.05, 0.05))
    row = by_name(rows_of(make_run([make_case("h2o", "64", ratio=8.0, ppl=0.03)])))["h2o@64"]
    assert row.stats["ppl"] == pytest.approx((0.03, 0.03, 0.03))
    assert row.stats["long_generation"] == pytest.approx((0.0, 0.0, 0.0))


def test_bootstrap_of_two_documents_spans_them_and_repeats():
    assert er.bootstrap_mean([0.0, 0.1]) == pytest.approx((0.05, 0.0, 0.1))
    spread = [0.01, 0.2, 0.05, 0.4, 0.03]
    first = er.bootstrap_mean(spread)
    assert first == er.bootstrap_mean(spread)
    assert min(spread) < first.low < first.value < first.high < max(spread)


def test_overall_is_the_mean_over_documents_of_the_mean_over_prefixes():
    nll = {("alice", 2048): 3.0 + math.log(1.1), ("alice", 4096): 2.9 + math.log(1.3), ("verne", 2048): 2.8}
    row = by_name(rows_of(make_run([make_case("snapkv", "128", ratio=5.0, nll=nll, long=0.02)])))["snapkv@128"]
    assert row.stats["ppl_by_prefix"][2048].value == pytest.approx(0.05)
    assert row.stats["ppl_by_prefix"][4096] == pytest.approx((0.3, 0.3, 0.3))  # one document
    assert row.stats["ppl"].value == pytest.approx((0.2 + 0.0) / 2)  # not (0.1 + 0.3 + 0) / 3
    assert row.stats["long_generation"] == pytest.approx((0.02, 0.02, 0.02))


def test_front_excludes_dominated_rows():
    rows = rows_of(make_run([make_case("a", "1", ratio=10.0, ppl=0.05), make_case("b", "1", ratio=8.0, ppl=0.10),
                             make_case("c", "1", ratio=20.0, ppl=0.20), make_case("d", "1", ratio=20.0, ppl=0.30)]))
    assert [r.name for r in er.pareto_front(rows)] == ["full", "a@1", "c@1"]


def test_best_at_each_saving():
    rows = rows_of(make_run([make_case("x", "1", ratio=9.9, ppl=0.001), make_case("y", "1", ratio=10.0, ppl=0.05),
                             make_case("z", "1", ratio=12.0, ppl=0.03), make_case("w", "1", ratio=25.0, ppl=0.4)]))
    assert [er.best_at(rows, s).name for s in (5, 10, 20)] == ["x@1", "z@1", "w@1"]
    assert er.best_at(rows, 30) is None
    assert "| ≥10× | z@1 | 12.00× | +3.00% [+3.00%, +3.00%] | – | +0.00% [+0.00%, +0.00%] |" in \
        er.best_table(rows)


def test_goal_reached_names_the_row():
    rows = rows_of(make_run([make_case("g", "64", ratio=12.0, ppl=0.005, retrieval=FULL_RETRIEVAL)]))
    text = er.goal_section(rows)
    assert "**Reached** by" in text and "**g@64** at 12.00×" in text


def test_goal_not_reached_says_who_came_closest_and_why():
    half = [(n, d, ok and n == 1000) for n, d, ok in FULL_RETRIEVAL]  # 3 of full's 5
    rows = rows_of(make_run([make_case("h", "64", ratio=12.0, ppl=0.015, retrieval=FULL_RETRIEVAL),
                             make_case("k", "64", ratio=11.0, ppl=0.005, retrieval=half),
                             make_case("m", "64", ratio=4.0, ppl=0.002, retrieval=FULL_RETRIEVAL)]))
    lines = er.goal_section(rows).splitlines()
    assert "**Not reached:**" in lines[2]
    upper, lowest, compressed = lines[4:7]
    assert "**h@64**" in upper and upper.endswith("In the way: perplexity increase +1.50% > +1%.")
    assert "**k@64**" in lowest and "In the way: retrieval 60% of full's < 95%." in lowest
    assert "**m@64**" in compressed and "In the way: compression 4.00× < 10×." in compressed


def test_retrieval_against_full():
    mine = [(1000, 0.0, True), (1000, 0.5, False), (1000, 1.0, True),
            (2000, 0.0, False), (2000, 0.5, False), (2000, 1.0, True)]
    rows = rows_of(make_run([make_case("r", "64", ratio=6.0, retrieval=mine)]))
    row = by_name(rows)["r@64"]
    assert row.stats["retrieval_by_length"] == pytest.approx({1000: 2 / 3, 2000: (1 / 3) / (2 / 3)})
    assert row.stats["retrieval"] == pytest.approx((3 / 6) / (5 / 6))
    assert "| 2000 | 100% (1/1) | 0% (0/1) | 100% (1/1) |" in er.full_retrieval_table(by_name(rows)["full"])
    assert "| r@64 | 67% | 50% | 60% | 50% |" in er.retrieval_table(rows)


def test_files_merge_by_label_unless_their_settings_differ():
    first = make_run([make_case("snapkv", "128", ratio=14.0, ppl=0.10)])
    again = make_run([make_case("snapkv", "128", ratio=14.0, ppl=0.50)], policies=["snapkv", "h2o"],
                     shared_prefill=True)  # what a run picks or how it schedules is no difference of settings
    other = make_run([make_case("snapkv", "128", ratio=14.0, nll={("alice", 8000): 4.0, ("verne", 8000): 4.0})],
                     perplexity_prefixes=[8000])
    other["cases"][0] = make_case("full", nll={("alice", 8000): 4.0 - math.log(1.2), ("verne", 8000): 3.0})
    rows = by_name(rows_of(first, again, other))
    assert sorted(rows) == ["full [results-3.json]", "full [results.json]",
                            "snapkv@128 [results-3.json]", "snapkv@128 [results.json]"]
    assert rows["snapkv@128 [results.json]"].stats["ppl"].value == pytest.approx(0.10)  # the first occurrence
    later = rows["snapkv@128 [results-3.json]"].stats["ppl"]  # against its own file's `full`
    assert later == pytest.approx(((0.2 + (math.e - 1)) / 2, 0.2, math.e - 1))


def test_a_share_of_the_prompt_is_one_row_whatever_prompt_its_example_was_resolved_at():
    """SimLayerKV at 50% resolves to a window of half the run's longest prompt: runs of other tasks (other prompt
    lengths) measure the same row. A budget in tokens resolves alike everywhere, so a different spec is a
    different row."""
    def case(budget, spec):
        return {**make_case("simlayerkv", budget, ratio=2.0), "example_spec": spec}
    perplexity = without(make_run([case("50%", "simlayerkv:window=3964")]), "retrieval")
    retrieval = without(make_run([case("50%", "simlayerkv:window=3496")]), "perplexity", "long_generation")
    assert sorted(by_name(rows_of(perplexity, retrieval))) == ["full", "simlayerkv@50%"]
    tokens = without(make_run([case("512", "simlayerkv:window=512")]), "retrieval")
    changed = without(make_run([case("512", "simlayerkv:window=480")]), "perplexity", "long_generation")
    assert len([name for name in by_name(rows_of(tokens, changed)) if name.startswith("simlayerkv@512")]) == 2


def without(run, *tasks):
    for case in run["cases"]:
        case.update({task: [] for task in tasks})
    return run


def test_files_merge_task_by_task():
    four = [(n, d, ok and (n, d) != (1000, 1.0)) for n, d, ok in FULL_RETRIEVAL]  # 4 of full's 5
    perplexity = without(make_run([make_case("snapkv", "50%", ratio=10.0, ppl=0.02)]), "long_generation", "retrieval")
    rest = without(make_run([make_case("snapkv", "50%", ratio=8.0, long=0.3, retrieval=four)],
                            perplexity_prefixes=[8000]), "perplexity")  # other prefixes, but no perplexity here
    rows = by_name(rows_of(perplexity, rest))
    assert sorted(rows) == ["full", "snapkv@50%"]
    s = rows["snapkv@50%"].stats
    assert s["ppl"].value == pytest.approx(0.02) and s["long_generation"].value == pytest.approx(0.3)
    assert s["retrieval"] == pytest.approx(0.8)
    assert s["ratio"] == pytest.approx((4 * 1000 + 4 * 800) / (8 * 100))  # bytes summed over both files' jobs
    assert rows["snapkv@50%"].settings["perplexity"]["perplexity_prefixes"] == [2048, 4096]


def test_labels_of_files_without_them():
    assert er.case_label({"policy": "simlayerkv", "budget": "20%", "kv_dtype": "int4"}) == "simlayerkv@20%+int4"
    assert er.case_label({"policy": "full", "budget": "", "kv_dtype": "f32"}) == "full"
    assert er.case_label({"policy": "full", "budget": "", "kv_dtype": "int8"}) == "full+int8"
    assert er.case_label({"label": "h2o@128", "policy": "h2o", "budget": "64", "kv_dtype": "f32"}) == "h2o@128"


def test_new_format_report(tmp_path):
    four = [(n, d, ok and (n, d) != (1000, 1.0)) for n, d, ok in FULL_RETRIEVAL]  # 4 of full's 5
    cases = [make_case("snapkv", "128", ratio=14.0, ppl=0.2, long=0.3, retrieval=four),
             make_case("simlayerkv", "20%", ratio=7.0, ppl=0.004, dtype="int4", retrieval=FULL_RETRIEVAL)]
    results = write(tmp_path / "new.json", {**make_run(cases, timing=(50.0, True, 10)), "commit": "abc1234"})
    before = write(tmp_path / "old.json", make_run([], timing=(100.0, False, 40)))  # older runs name no commit
    out = tmp_path / "report"
    er.main([results, "--out", str(out), "--timing-before", before])
    text = (out / "README.md").read_text()
    assert "**Wall time:** `results.json` 50.0 s, prefill shared (10 prefills), built from abc1234." in text
    assert "100.0 s in [`timing-before.json`](timing-before.json) (prefill not shared, 40 prefills)" in text
    assert "before / after = 2.00×" in text
    assert f"--out {out} --layer-budget 128 --timing-before {out}/timing-before.json" in text
    assert (out / "timing-before.json").exists()
    assert "| simlayerkv@20%+int4 | +0.40% [+0.40%, +0.40%] | +0.40% [+0.40%, +0.40%] | +0.40% [+0.40%, +0.40%] |" \
        in section(text, "Perplexity increase per prefix length")
    assert "| ≥10× | snapkv@128 | 14.00× | +20.00% [+20.00%, +20.00%] | 80% | +30.00% [+30.00%, +30.00%] |" in text
    assert "| snapkv@128 | 14.00× |" in section(text, "Quality against memory")
    for name in ("pareto_front.png", "retrieval_by_depth.png", "quality_vs_memory.png", "layer_occupancy.png"):
        assert (out / name).stat().st_size > 10_000


def test_timing_before_needs_a_timing(tmp_path):
    results = write(tmp_path / "new.json", make_run([], timing=(50.0, True, 10)))
    before = write(tmp_path / "old.json", make_run([]))
    with pytest.raises(SystemExit, match="no \"timing\" to compare"):
        er.main([results, "--out", str(tmp_path / "report"), "--timing-before", before])


def test_inputs_in_the_report_folder_keep_their_names_in_any_order(tmp_path):
    """The order of the inputs is their precedence: a newer run listed first must not be copied over the older
    files it shares the folder with."""
    out = tmp_path / "report"
    out.mkdir()
    older = write(out / "results.json", make_run([make_case("snapkv", "128", ratio=4.0, ppl=0.05)],
                                                 timing=(100.0, True, 8)))
    newer = write(out / "results-2.json", make_run([make_case("snapkv", "128", ratio=4.0, ppl=0.01)],
                                                   timing=(50.0, True, 8)))
    er.main([newer, older, "--out", str(out)])
    assert json.loads((out / "results.json").read_text())["timing"]["wall_seconds"] == 100.0
    assert json.loads((out / "results-2.json").read_text())["timing"]["wall_seconds"] == 50.0
    text = (out / "README.md").read_text()
    assert "`results-2.json` 50.0 s" in text and "`results.json` 100.0 s" in text
    assert "| snapkv@128 | +1.00% [" in text, "the first input's measurement wins"


def test_an_input_from_elsewhere_never_overwrites_one_in_the_report_folder(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    inside = write(out / "results-2.json", make_run([], timing=(50.0, True, 8)))
    outside = write(tmp_path / "new.json", make_run([], timing=(10.0, True, 8)))
    with pytest.raises(SystemExit, match="would overwrite another input"):
        er.main([inside, outside, "--out", str(out)])
    assert json.loads((out / "results-2.json").read_text())["timing"]["wall_seconds"] == 50.0


def ruler_items(scores):
    """RULER results as `strata eval` writes them, from [(task, setting, recall)]."""
    return [{"task": t, "length": 2048, "trial": i, "setting": s, "expected": ["1234567"], "answer": "", "recall": x}
            for i, (t, s, x) in enumerate(scores)]


FULL_RULER = [("niah_single", "in_prompt", 1.0), ("niah_single", "in_prompt", 0.5),
              ("common_words", "in_prompt", 0.3), ("niah_single", "after_compression", 0.8)]


def test_ruler_averages_leave_out_the_tasks_full_fails():
    """full: niah_single 0.75 in the prompt, 0.8 after compression; common_words 0.3, below the floor of 0.5."""
    row = ruler_items([("niah_single", "in_prompt", 0.75), ("niah_single", "in_prompt", 0.0),
                       ("common_words", "in_prompt", 0.9), ("niah_single", "after_compression", 0.2)])
    relative = er.relative_ruler(row, ruler_items(FULL_RULER))
    assert relative == {"in_prompt": pytest.approx(0.375 / 0.75), "after_compression": pytest.approx(0.2 / 0.8)}


def test_ruler_section_shows_both_settings_and_what_it_left_out(tmp_path):
    snapkv = make_case("snapkv", "128", ratio=14.0)
    snapkv["ruler"] = ruler_items([("niah_single", "in_prompt", 0.75), ("niah_single", "in_prompt", 0.75),
                                   ("common_words", "in_prompt", 0.0), ("niah_single", "after_compression", 0.4)])
    run = make_run([snapkv])
    run["cases"][0]["ruler"] = ruler_items(FULL_RULER)
    out = tmp_path / "report"
    er.main([write(tmp_path / "r.json", run), "--out", str(out)])
    text = section((out / "README.md").read_text(), "RULER")
    assert "| task | 2,048, in_prompt | 2,048, after_compression | `full` below 50% at |" in text
    assert "| common_words | 30% | – | 2,048 in_prompt |" in text
    assert "| niah_single | 75% | 80% | – |" in text
    in_prompt, after = text.split("### in_prompt")[1].split("### after_compression")
    assert "| snapkv@128 | 14.0× | 0% | 75% | 100% |" in in_prompt
    assert "| snapkv@128 | 14.0× | 40% | 50% |" in after
    assert "![RULER against memory, per setting](ruler_frontier.png)" in text
    assert (out / "ruler_frontier.png").stat().st_size > 10_000


def test_memory_at_the_peak_and_on_the_bf16_basis(tmp_path):
    """A quantized row saves half as much against bf16 entries, but for its full-precision share (its unsealed
    entries), which halves like `full`'s; a full-precision row as much; a file without peaks shows none."""
    snapkv = make_case("snapkv", "128", ratio=14.0)
    snapkv["memory"].update(peak_bytes=400, peak_ratio=1.2)
    quantized = make_case("simlayerkv", "20%", ratio=7.0, dtype="int4")
    quantized["memory"].update(peak_bytes=400, peak_ratio=1.1)
    # Held 400 bytes at the end (100 of them unsealed, full precision) and 800 at the peak (600 full precision) of
    # `full`'s 1,600: on the bf16 basis `full` holds 800, the row 350 at the end and 500 at the peak.
    chunked = make_case("snapkv", "10%", ratio=4.0, dtype="int4")
    chunked["memory"].update(full_precision_bytes=100, peak_bytes=800, peak_full_precision_bytes=600, peak_ratio=2.0)
    out = tmp_path / "report"
    er.main([write(tmp_path / "r.json", make_run([snapkv, quantized, chunked])), "--out", str(out)])
    text = section((out / "README.md").read_text(), "Memory as users pay it")
    assert "| snapkv@128 | 14.00× | 1.20× | 14.00× | 1.20× |" in text
    assert "| simlayerkv@20%+int4 | 7.00× | 1.10× | 3.50× | – |" in text  # its peak's unsealed share unknown
    assert f"| snapkv@10%+int4 | 4.00× | 2.00× | {800 / 350:.2f}× | 1.60× |" in text
    assert "| full | 1.00× | – | 1.00× | – |" in text


@pytest.mark.parametrize("df,table", [(1, 12.7062), (2, 4.3027), (8, 2.3060), (30, 2.0423), (100, 1.9840)])
def test_t_quantiles_match_the_printed_tables(df, table):
    assert er.t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)


def test_t_interval_and_spread_by_hand():
    """Three documents at +1%, +2%, +3%: mean 2%, standard deviation 1%, half-width t(0.975, 2) 0.01 / sqrt(3)."""
    t = er.t_interval([0.01, 0.02, 0.03])
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert (t.value, t.low, t.high) == pytest.approx((0.02, 0.02 - half, 0.02 + half))
    assert er.t_interval([0.05]) is None
    assert tuple(er.spread([0.03, -0.01, 0.01])) == pytest.approx((0.01, -0.01, 0.03))


def test_a_long_generation_that_compressed_nothing_is_flagged(tmp_path):
    """snapkv@50% of a 128-token prompt and 1,024 generated tokens keeps all: its long generation says so."""
    kept_all = make_case("snapkv", "50%", ratio=1.5, long=0.0)
    rolling = make_case("streaming:mode=rolling", "10%", ratio=8.0, long=0.05)
    for g in kept_all["long_generation"]:
        g["memory_ratio"] = 1.0
    for g in rolling["long_generation"]:
        g["memory_ratio"] = 9.0
    out = tmp_path / "report"
    er.main([write(tmp_path / "r.json", make_run([kept_all, rolling])), "--out", str(out)])
    rows = section((out / "README.md").read_text(), "Every row")
    assert "| +0.00% [+0.00%, +0.00%] (compressed nothing) |" in next(r for r in rows.splitlines() if "snapkv@50%" in r)
    assert "compressed nothing" not in next(r for r in rows.splitlines() if "rolling" in r)


def test_ruler_goal_names_what_stands_in_the_way(tmp_path):
    """At 12x at the end but 1.1x at its peak, and half of full's RULER after compression, snapkv misses two terms;
    an int4 row at 12x at its peak on the f32 basis is 6x on the bf16 basis."""
    snapkv = make_case("snapkv", "10%", ratio=12.0, ppl=0.005)
    snapkv["memory"].update(peak_bytes=100, peak_ratio=1.1)
    snapkv["ruler"] = ruler_items([("niah_single", "in_prompt", 1.0), ("niah_single", "after_compression", 0.4)])
    quantized = make_case("streaming", "10%", ratio=12.0, ppl=0.005, dtype="int4")
    quantized["memory"].update(peak_bytes=400, peak_full_precision_bytes=0, peak_ratio=12.0)  # sealed at its peak
    quantized["ruler"] = ruler_items([("niah_single", "in_prompt", 1.0), ("niah_single", "after_compression", 0.8)])
    run = make_run([snapkv, quantized])
    run["cases"][0]["ruler"] = ruler_items([("niah_single", "in_prompt", 1.0), ("niah_single", "after_compression", 0.8)])
    out = tmp_path / "report"
    er.main([write(tmp_path / "r.json", run), "--out", str(out)])
    text = section((out / "README.md").read_text(), "RULER")
    assert "**Not reached.**" in text
    assert ("- **streaming@10%+int4**. In the way: 6.00× less at its peak (bf16 basis) < 10×." in text)
    assert ("- **snapkv@10%**. In the way: 1.10× less at its peak (bf16 basis) < 10×; RULER after_compression 50% "
            "of full's < 95%." in text)


def test_a_run_without_perplexity_reports_only_what_it_measured(tmp_path):
    """A RULER-only run: no perplexity goal, front or row table, and no empty quality plot."""
    snapkv = make_case("snapkv", "128", ratio=14.0)
    snapkv["ruler"] = ruler_items([("niah_single", "in_prompt", 0.5), ("niah_single", "after_compression", 0.5)])
    run = make_run([snapkv])
    run["cases"][0]["ruler"] = ruler_items([("niah_single", "in_prompt", 1.0), ("niah_single", "after_compression", 1.0)])
    for case in run["cases"]:
        case["perplexity"], case["long_generation"] = [], []
    out = tmp_path / "report"
    er.main([write(tmp_path / "r.json", run), "--out", str(out)])
    text = (out / "README.md").read_text()
    assert "## RULER" in text and "## Memory as users pay it" in text
    for absent in ("## The goal", "## Every row", "Perplexity increase**", "Pareto front"):
        assert absent not in text
    assert not (out / "quality_vs_memory.png").exists()


def test_ruler_runs_of_other_tasks_merge_case_by_case():
    """A run of niah_single and one of niah_multikey, at the same lengths and seed, measured other cases of one row:
    the row holds both tasks, each against its own file's `full`; a case both files hold counts once."""
    def run_of(task, full_recall, snapkv_recall):
        snapkv = make_case("snapkv", "10%", ratio=10.0)
        snapkv["ruler"] = [{**item, "task": task} for item in
                           ruler_items([(task, "in_prompt", snapkv_recall), (task, "after_compression", 0.0)])]
        run = make_run([snapkv], ruler_tasks=[task], ruler_lengths=[2048], ruler_trials=2, seed=1)
        run["cases"][0]["ruler"] = ruler_items([(task, "in_prompt", full_recall), (task, "after_compression", 1.0)])
        return run
    single, multikey = run_of("niah_single", 1.0, 0.5), run_of("niah_multikey", 0.5, 0.5)
    rows = by_name(rows_of(single, multikey, run_of("niah_single", 1.0, 0.0)))
    assert sorted(rows) == ["full", "snapkv@10%"]
    snapkv = rows["snapkv@10%"]
    assert sorted({(r["task"], r["setting"]) for r in snapkv.case["ruler"]}) == [
        ("niah_multikey", "after_compression"), ("niah_multikey", "in_prompt"),
        ("niah_single", "after_compression"), ("niah_single", "in_prompt")]
    assert len(snapkv.case["ruler"]) == 4  # the third file's niah_single cases were measured already
    assert snapkv.stats["ruler"] == {"in_prompt": pytest.approx((0.5 + 0.5) / (1.0 + 0.5)),
                                     "after_compression": pytest.approx(0.0)}


def test_rows_about_5x_and_10x_at_their_ends_and_peaks(tmp_path):
    """An end-mode row at 4.6x at its end and 1.02x at its peak is about 5x at its end only; a chunked int4 row at
    20x at its peak on the f32 basis is about 10x there on the bf16 basis."""
    end = make_case("snapkv", "20%", ratio=4.6)
    end["memory"].update(peak_bytes=100, peak_ratio=1.02)
    chunked = make_case("streaming", "10%", ratio=24.0, dtype="int4")
    chunked["memory"].update(peak_bytes=480, peak_full_precision_bytes=0, peak_ratio=20.0)
    for case, recall in ((end, 0.25), (chunked, 1.0)):
        case["ruler"] = ruler_items([("niah_single", "in_prompt", recall), ("niah_single", "after_compression", 0.5)])
    run = make_run([end, chunked])
    run["cases"][0]["ruler"] = ruler_items([("niah_single", "in_prompt", 1.0), ("niah_single", "after_compression", 1.0)])
    out = tmp_path / "report"
    er.main([write(tmp_path / "r.json", run), "--out", str(out)])
    text = section((out / "README.md").read_text(), "RULER").split("### About 5× and 10× less memory")[1]
    tables = {tuple(re.match(r"(\d+)× less at its (end|peak)", part).groups()): part.split("\n#")[0]
              for part in text.split("**About ")[1:]}
    assert "| snapkv@20% | 4.6× | 1.0× | 25% | 50% | 25% | 50% |" in tables["5", "end"]
    assert "| streaming@10%+int4 | 12.0× | 10.0× | 100% | 50% | 100% | 50% |" in tables["10", "peak"]
    assert "streaming" not in tables["5", "end"] and "snapkv" not in tables["10", "peak"]
    assert tables["5", "peak"].startswith("5× less at its peak:** no row.")
