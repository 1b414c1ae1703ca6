"""`strata tokenize` against Hugging Face tokenizers (tools/reference_tokenizer.py) on the whole corpus
tests/fixtures/tokenizer_corpus.jsonl: the ids must be exactly equal, with and without special-token parsing, and
decoding must give the text back.

    .venv/bin/python -m pytest tests/model/tokenizer_reference_test.py     # STRATA_BIN overrides build/strata
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from reference_tokenizer import build_reference_tokenizer, encode_without_specials  # noqa: E402

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.jsonl"
MAX_REPORTED = 20


def strata_binary():
    path = Path(os.environ.get("STRATA_BIN", "build/strata"))
    if not path.is_absolute():
        path = ROOT / path
    if not path.exists():
        pytest.fail(f"{path} is missing: run tools/setup.sh to build it (or point STRATA_BIN at a strata binary)")
    return path


def run_tokenize(flags, lines):
    """Feeds JSON lines to `strata tokenize` and returns the parsed output, one value per input line."""
    if not MODEL.exists():
        pytest.fail(f"model file {MODEL} is missing: run tools/setup.sh to fetch it")
    result = subprocess.run([str(strata_binary()), "tokenize", "--model", str(MODEL), *flags],
                            input="".join(line + "\n" for line in lines).encode("utf-8"),
                            capture_output=True, timeout=300)
    assert result.returncode == 0, f"strata tokenize {' '.join(flags)} failed: {result.stderr.decode(errors='replace')}"
    outputs = [json.loads(line) for line in result.stdout.decode("utf-8").split("\n") if line]
    assert len(outputs) == len(lines), f"{len(lines)} lines in, {len(outputs)} out"
    return outputs


@pytest.fixture(scope="module")
def corpus():
    lines = [line for line in CORPUS.read_text(encoding="utf-8").split("\n") if line]
    return lines, [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def reference():
    if not MODEL.exists():
        pytest.fail(f"model file {MODEL} is missing: run tools/setup.sh to fetch it")
    return build_reference_tokenizer(str(MODEL))


def reference_ids(reference, text, parse_special):
    if parse_special:
        return reference.encode(text, add_special_tokens=False).ids
    return encode_without_specials(reference, text)


def _gpt2_byte_symbols():
    kept = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    shifted = iter(range(0x100, 0x200))
    return [chr(b) if b in kept else chr(next(shifted)) for b in range(256)]


@pytest.fixture(scope="module")
def representable_bytes(reference):
    """The bytes that have a symbol in the vocabulary (SmolLM2 lacks 21 of them; HF drops those)."""
    vocab = reference.get_vocab()
    return {b for b, symbol in enumerate(_gpt2_byte_symbols()) if symbol in vocab}


def test_corpus_is_large_and_varied(corpus):
    _, texts = corpus
    assert len(texts) >= 1200
    assert "" in texts
    joined = "".join(texts)
    for needle in ["<|im_end|>", "\u200d", "\U0001f3fd", "\u0663", "\u00bd", "\u216b", "\r\n", "\t", "'RE", "\x04",
                   "\u4e2d", "\u0627", "\u0928", "def ", "\u0301"]:
        assert needle in joined, f"corpus lacks {needle!r}"


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "no_special"])
def test_ids_equal_reference(corpus, reference, parse_special):
    lines, texts = corpus
    got = run_tokenize(["--special"] if parse_special else [], lines)
    mismatches = []
    for text, ids in zip(texts, got):
        expected = reference_ids(reference, text, parse_special)
        if ids != expected:
            mismatches.append(f"string {text!r}\n  strata:    {ids}\n  reference: {expected}")
    matched = len(texts) - len(mismatches)
    report = "\n".join(mismatches[:MAX_REPORTED])
    assert not mismatches, f"{matched}/{len(texts)} strings match; first mismatches:\n{report}"
    if not parse_special:
        specials = {reference.token_to_id(t) for t in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]}
        assert not any(specials & set(ids) for ids in got), "special ids produced without --special"


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "no_special"])
def test_decode_round_trips(corpus, reference, representable_bytes, parse_special):
    lines, texts = corpus
    ids = run_tokenize(["--special"] if parse_special else [], lines)
    decoded = run_tokenize(["--decode"], [json.dumps(i) for i in ids])
    n_representable = 0
    failures = []
    for text, token_ids, back in zip(texts, ids, decoded):
        expected = reference.decode(token_ids, skip_special_tokens=False)
        if back != expected:
            failures.append(f"string {text!r}: strata decodes {back!r}, reference {expected!r}")
        if set(text.encode("utf-8")) <= representable_bytes:
            n_representable += 1
            if back != text:
                failures.append(f"string {text!r} round-trips to {back!r}")
    assert not failures, "\n".join(failures[:MAX_REPORTED])
    assert n_representable >= len(texts) * 0.9, f"only {n_representable} representable strings"


def test_decode_skips_special_tokens(corpus, reference):
    lines, texts = corpus
    ids = run_tokenize(["--special"], lines)
    decoded = run_tokenize(["--decode", "--skip-special"], [json.dumps(i) for i in ids])
    failures = [f"ids {token_ids}: strata {back!r}, reference {reference.decode(token_ids, skip_special_tokens=True)!r}"
                for token_ids, back in zip(ids, decoded)
                if back != reference.decode(token_ids, skip_special_tokens=True)]
    assert not failures, "\n".join(failures[:MAX_REPORTED])
