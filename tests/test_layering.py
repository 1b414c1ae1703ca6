"""The folders' layers (docs/architecture.md): a source file includes only headers of its own folder or of a layer
below it, so that no include runs upward and the folder names tell where a change belongs.

    kernels < cache < parallel < model < rank, grammar < leader < routing, eval < router < daemon < bench

kernels/cpu and kernels/cuda implement kernels/backend.h, cache/policies implement cache/compression_policy.h and
daemon/commands are the daemon's: a subfolder belongs to its top-level folder's layer. routing and eval share a
layer and include nothing of each other; so do rank and grammar.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"kernels": 0, "cache": 1, "parallel": 2, "model": 3, "rank": 4, "grammar": 4, "leader": 5, "routing": 6, "eval": 6,
          "router": 7, "daemon": 8, "bench": 9}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources():
    for folder in LAYERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".h", ".cpp", ".cu", ".cuh"):
                yield folder, path


def test_every_source_folder_has_a_layer():
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and any(p.rglob("*.cpp"))}
    folders -= {"tests", "tools", "docs", "deploy", "configs", "models", ".venv"}
    folders = {f for f in folders if not f.startswith("build")}
    assert folders <= set(LAYERS), f"folders without a layer: {sorted(folders - set(LAYERS))}"


def test_no_include_runs_upward():
    upward = []
    for folder, path in sources():
        for target in INCLUDE.findall(path.read_text(errors="replace")):
            top = target.split("/", 1)[0]
            if top not in LAYERS or top == folder:
                continue
            if LAYERS[top] >= LAYERS[folder]:
                upward.append(f"{path.relative_to(ROOT)} includes {target}")
    assert not upward, "includes that run upward or sideways:\n" + "\n".join(upward)
