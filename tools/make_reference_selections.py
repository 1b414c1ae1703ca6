"""Writes tests/fixtures/selections/<prompt>.json: the entries SnapKV, PyramidKV, StreamingLLM, Expected Attention and
KVzip keep, computed independently of Strata (format: that folder's README.md).

The attention probabilities come from Hugging Face transformers loading models/SmolLM2-135M-Instruct.Q4_1.gguf
(dequantized to fp32, eager attention, output_attentions=True): one forward pass over the prompt gives, for every
layer, P[query head][row][key] as the plain softmax(QK^T / sqrt(d)) with the causal mask. The selection is then
the arithmetic of ../shared/specs/pyramidkv.md (sections 2, 3.1, 3.3, 3.4 and 8), in float64, with Strata's
documented choices (docs/compression.md):
  - per KV head: the G = 3 query heads' window sums (query head h belongs to KV head h // 3) are reduced by MEAN
    before pooling (spec section 5);
  - pooling as PyTorch's max_pool1d / avg_pool1d(count_include_pad=True), stride 1, padding k // 2 (spec 2.5);
  - ties: higher score first, then lower index; kept indices ascending, the window appended (spec 1.5-1.6);
  - PyramidKV's official integer schedule (spec 3.4), L = 30 layers, beta = 20.

Expected Attention (Devoto et al., 2025, "Expected Attention: KV Cache Compression by Estimating Attention from
Future Queries Distribution"; NVIDIA kvpress's ExpectedAttentionPress) uses the same forward pass: forward hooks on
every layer's self_attn.q_proj capture the queries before RoPE, and the cache (use_cache=True) gives the keys after
RoPE and the values. Per layer, in float64, with m = n - sinks rows and entries [sinks, n):
  - mu_h, Sigma_h: the mean and the population covariance (1/m) of query head h's rows [sinks, n);
  - Rbar: the mean over positions [n, n + future) of the RoPE matrix R(p) = diag(cos_p) + diag(sin_p) P (P is
    rotate_half), cos/sin from the model's own rotary embedding (computed there in fp32, then cast);
  - z[h][e] = (Rbar mu_h) . k_e / sqrt(d) + k_e^T (Rbar Sigma_h Rbar^T) k_e / (2 d), softmax over e in [sinks, n);
  - per KV head g: the MEAN of its 3 query heads' probabilities times ||v_e||_2; the top C - sinks of those with
    the same tie rule, the sinks [0, sinks) kept in front.
Self-checks run on every prompt: z recomputed entry by entry in numpy, Rbar against the model's own
apply_rotary_pos_emb, and the cached keys against k_proj's output rotated at their positions.

KVzip (Kim et al., 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction"; NVIDIA kvpress's
KVzipPress) takes a second forward pass, over the prompt (n ids) followed by R scoring ids at positions n, n + 1, ...:
instruction + prompt[:h] + answer_start + prompt, where instruction is the reference tokenizer's ids of
KVZIP_INSTRUCTION (below), h = min(8, n), and answer_start the ids of what the GGUF's own chat template (rendered with
jinja2) puts after the user's content with add_generation_prompt (SmolLM2: "<|im_end|>\\n<|im_start|>assistant\\n",
special tokens as single ids). Forward hooks on every layer's self_attn take the attention probabilities P (eager,
fp32; no output_attentions, so that one layer's [9, n + R, n + R] is held at a time) and reduce them at once:
  - score of entry e in [0, n) for query head h: the MAX of P[h][r][e] over all scoring rows r in [n, n + R);
  - per KV head g: the MAX over its 3 query heads; the top C - sinks of entries [sinks, n) with the same tie rule,
    the sinks [0, sinks) kept in front.
Self-check on every prompt (layers 0 and 29): a sample of scoring rows of P recomputed in float64 from q_proj's and
k_proj's outputs rotated with the model's own RoPE, and the scores recomputed with numpy from that layer's full P.
Nothing here imports or runs Strata code; the prompts are tokenized with tools/reference_tokenizer.py.

Needs the reference stack (tools/requirements-reference.txt: torch, transformers, accelerate, gguf, tokenizers,
jinja2). CI never runs this; rerun it by hand when a prompt or a configuration changes and commit the output:

    nice -n 10 python tools/make_reference_selections.py
"""
import argparse
import json
import os
import shlex
import sys
from importlib.metadata import version
from pathlib import Path

import gguf
import jinja2
import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tokenizer import build_reference_tokenizer  # noqa: E402
from file_digest import sha256  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEXT = "tests/fixtures/texts/the_keepers_ledger.txt"
# (name, heading the piece starts at, tokens): the first that many tokens of the text from that heading.
PROMPTS = [
    ("ledger_300", "CHAPTER III. THE VILLAGE", 300),
    ("ledger_1000", "THE KEEPER'S LEDGER", 1000),
]
PIECE_CHARS = 8000  # more than enough text for 1,000 tokens (about 4.3 characters per token)
BUDGETS = [64, 128]
N_LAYERS, N_HEADS, N_KV_HEADS, HEAD_DIM = 30, 9, 3, 64
# Candidates whose score lies within this relative distance of the cut are listed in "band", so that a test can
# tell a near-tie at the cut from a real disagreement.
BAND_REL = 1e-3
BAND_MAX = 64
# KVzip's reconstruction prompt (kvpress's KVzipPress, for a chunk after the first) and how many of the context's first
# ids follow it ("starting with" them).
KVZIP_INSTRUCTION = "\n\nRepeat the part of the previous context exactly, starting with"
KVZIP_HEAD = 8
KVZIP_CHECK_ROWS = 6  # scoring rows per checked layer recomputed in float64


def configs():
    """(policy spec as Strata parses it, parameters for the arithmetic below). Every parameter is spelled out, so
    that the fixture does not depend on Strata's defaults."""
    out = []
    for c in BUDGETS:
        # SnapKV's official defaults (spec 3.3) and the settings of PyramidKV's runs (spec 3.3, section 4).
        out.append((f"snapkv:budget={c},window=32,kernel=5,pool=avg,agg=mean",
                    dict(method="snapkv", budget=c, window=32, kernel=5, pool="avg")))
        out.append((f"snapkv:budget={c},window=8,kernel=7,pool=max,agg=mean",
                    dict(method="snapkv", budget=c, window=8, kernel=7, pool="max")))
        out.append((f"pyramidkv:budget={c},window=8,kernel=7,pool=max,beta=20,schedule=official,agg=mean",
                    dict(method="pyramidkv", budget=c, window=8, kernel=7, pool="max", beta=20)))
        out.append((f"streaming:budget={c},sinks=4,mode=one_shot", dict(method="streaming", budget=c, sinks=4)))
    for c in BUDGETS:
        # kvpress's ExpectedAttentionPress defaults: n_sink = 4, n_future_positions = 512, use_covariance and
        # use_vnorm on (epsilon = 0).
        out.append((f"expected_attention:budget={c},sinks=4,future=512,covariance=true,vnorm=true",
                    dict(method="expected_attention", budget=c, sinks=4, future=512, covariance=True, vnorm=True)))
    for c in BUDGETS:
        # KVzip as kvpress's KVzipPress (n_sink = 4), one scoring pass over instruction + head + answer_start + prompt.
        out.append((f"kvzip:budget={c},sinks=4", dict(method="kvzip", budget=c, sinks=4)))
    return out


def prompt_ids(tokenizer, text, heading, n_tokens):
    """The first n_tokens token ids of the text from `heading` (the ids are what the fixture stores)."""
    start = text.index(heading)
    ids = tokenizer.encode(text[start:start + PIECE_CHARS], add_special_tokens=False).ids
    if len(ids) < n_tokens + 1:
        raise ValueError(f"fewer than {n_tokens} tokens after {heading!r}")
    return ids[:n_tokens]


def pyramid_budget_official(layer, n_layers, n, capacity, window, beta):
    """Spec 3.4, the code formula: the non-window budget k_l, or None when nothing is compressed (n < C)."""
    if n < capacity:
        return None
    a = capacity - window
    if n < 2 * a or n_layers == 1:
        return a
    lo = a // beta
    hi = 2 * a - lo
    if hi >= n - window:
        hi = n - window
        lo = 2 * a - hi
    step = (hi - lo) // (n_layers - 1)
    return hi - layer * step


def pool(scores, kernel, kind):
    """Spec 2.5: 1-D pooling along the keys, stride 1, padding k // 2 (PyTorch's, as the official code)."""
    x = torch.from_numpy(scores).view(1, 1, -1)
    if kind == "max":
        y = F.max_pool1d(x, kernel_size=kernel, stride=1, padding=kernel // 2)
    else:
        y = F.avg_pool1d(x, kernel_size=kernel, stride=1, padding=kernel // 2, count_include_pad=True)
    return y.view(-1).numpy()


def ranges(indices):
    """[0, 1, 2, 3, 17, 25, 26] -> "0-3,17,25-26" (ascending input)."""
    parts, i = [], 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        parts.append(str(indices[i]) if i == j else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ",".join(parts)


def g9(x):
    return float(f"{x:.9g}")


def select(scores, keep, n, window, sinks=0):
    """Spec 2.6 with Strata's tie rule: the top-`keep` of scores, higher score first, then lower index; returns the
    kept indices ascending, and the cut's numbers. scores[i] is entry sinks + i: the candidates are [0, n - w) for
    SnapKV and PyramidKV (sinks = 0, the window [n - w, n) appended) and [sinks, n) for Expected Attention (w = 0,
    the sinks [0, sinks) in front). Band indices are entry indices."""
    m = len(scores)
    order = np.lexsort((np.arange(m), -scores))  # last key is primary: descending score, then ascending index
    kept = list(range(sinks)) + sorted(sinks + int(i) for i in order[:keep]) + list(range(n - window, n))
    last_kept = float(scores[order[keep - 1]]) if keep > 0 else None
    first_dropped = float(scores[order[keep]]) if keep < m else None
    record = {"kept": ranges(kept), "last_kept": None if last_kept is None else g9(last_kept),
              "first_dropped": None if first_dropped is None else g9(first_dropped)}
    if last_kept is not None and first_dropped is not None:
        scale = abs(last_kept)
        record["margin_rel"] = g9((last_kept - first_dropped) / scale) if scale > 0 else 0.0
        near = [int(i) for i in order
                if abs(scores[i] - last_kept) <= BAND_REL * scale or abs(scores[i] - first_dropped) <= BAND_REL * scale]
        near.sort(key=lambda i: min(abs(scores[i] - last_kept), abs(scores[i] - first_dropped)))
        record["band"] = sorted([sinks + i, g9(float(scores[i]))] for i in near[:BAND_MAX])
    return record


def window_sums(attentions, n, window):
    """Per layer, [KV head][n - w] in float64: sum over the w window query rows of P[row][key] for the non-window
    keys (spec 2.4: the softmax ran over all n keys, window columns dropped, not renormalised), then the MEAN over
    the query heads of each KV head (spec 5; query head h belongs to KV head h // G)."""
    group = N_HEADS // N_KV_HEADS
    out = []
    for probs in attentions:  # [1, heads, n, n]
        s = probs[0, :, n - window:, :n - window].to(torch.float64).sum(dim=1)  # [heads, n - w]
        out.append(s.view(N_KV_HEADS, group, n - window).mean(dim=1).numpy())
    return out


def rope_matrices(rotary_emb, positions):
    """[len(positions), d, d] float64: R(p) = diag(cos_p) + diag(sin_p) P, with cos/sin from the model's own rotary
    embedding (it computes them in fp32) and P the matrix of rotate_half (P[d/2:, :d/2] = I, P[:d/2, d/2:] = -I),
    so that R(p) x = x * cos_p + rotate_half(x) * sin_p, transformers' apply_rotary_pos_emb."""
    cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float32), torch.tensor([list(positions)]))
    cos, sin = cos[0].to(torch.float64), sin[0].to(torch.float64)  # [p, d]
    d = cos.shape[-1]
    half = d // 2
    rot = torch.zeros(d, d, dtype=torch.float64)
    rot[half:, :half] = torch.eye(half, dtype=torch.float64)
    rot[:half, half:] = -torch.eye(half, dtype=torch.float64)
    return cos[:, :, None] * torch.eye(d, dtype=torch.float64) + sin[:, :, None] * rot


def mean_rope(rotary_emb, n, future):
    """Rbar: the mean of R(p) over the future positions p in [n, n + future), float64 [d, d]."""
    return rope_matrices(rotary_emb, range(n, n + future)).mean(dim=0)


def expected_attention(queries, keys, values, rbar, sinks, covariance, vnorm):
    """One layer, float64. queries [n, n_heads * d] (q_proj's output, before RoPE); keys, values [n_kv_heads, n, d]
    (keys after RoPE, as cached). Returns (scores [n_kv_heads, n - sinks] for entries [sinks, n), and the
    intermediates (mubar [heads, d], sigmabar [heads, d, d], z [heads, n - sinks]) for the self-check)."""
    n = queries.shape[0]
    d = keys.shape[-1]
    m = n - sinks
    group = N_HEADS // N_KV_HEADS
    q = queries[sinks:].view(m, N_HEADS, d).transpose(0, 1)  # [heads, m, d]
    mu = q.mean(dim=1)  # [heads, d]
    centered = q - mu[:, None, :]
    sigma = torch.einsum("hri,hrj->hij", centered, centered) / m  # population covariance, as kvpress
    mubar = mu @ rbar.T  # Rbar mu_h
    sigmabar = rbar @ sigma @ rbar.T  # Rbar Sigma_h Rbar^T (broadcast over heads)
    k = keys[:, sinks:].repeat_interleave(group, dim=0)  # [heads, m, d]: query head h reads KV head h // group
    z = torch.einsum("hi,hei->he", mubar, k) / d ** 0.5
    if covariance:
        z = z + torch.einsum("hei,hij,hej->he", k, sigmabar, k) / (2 * d)
    probs = torch.softmax(z, dim=-1)
    scores = probs.view(N_KV_HEADS, group, m).mean(dim=1)  # MEAN over the query heads of each KV head
    if vnorm:
        scores = scores * values[:, sinks:].norm(dim=-1)
    return scores, (mubar, sigmabar, z)


def check_expected_attention(rotary_emb, queries, keys, values, k_proj_out, n, sinks, future):
    """Self-checks of one layer's arithmetic, a second way each: Rbar against transformers' apply_rotary_pos_emb;
    the cached keys against k_proj's output rotated at their positions (they are post-RoPE); mu, Sigma, z, the
    softmax and the scores recomputed with numpy, z entry by entry in plain loops for a sample of entries."""
    d = keys.shape[-1]
    gen = np.random.default_rng(0)
    vec = torch.from_numpy(gen.standard_normal((1, 1, 1, d)))
    cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float32), torch.tensor([[n]]))
    rotated, _ = apply_rotary_pos_emb(vec, vec, cos.to(torch.float64), sin.to(torch.float64))
    one = mean_rope(rotary_emb, n, 1)
    assert torch.equal(one, rope_matrices(rotary_emb, [n])[0]), "Rbar for future = 1 is not R(n)"
    assert torch.allclose(one @ vec.view(d), rotated.view(d), rtol=0, atol=1e-14), "R(n) != apply_rotary_pos_emb"
    # The average: Rbar x is the mean over the future positions of apply_rotary_pos_emb(x).
    cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float32), torch.arange(n, n + future)[None])
    rotated, _ = apply_rotary_pos_emb(vec, vec, cos.to(torch.float64), sin.to(torch.float64))  # [1, 1, future, d]
    assert torch.allclose(mean_rope(rotary_emb, n, future) @ vec.view(d), rotated[0, 0].mean(dim=0), rtol=0,
                          atol=1e-13), "Rbar != the mean of apply_rotary_pos_emb"
    # The cached keys are k_proj's output after RoPE at positions 0 .. n - 1 (fp32 both).
    cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float32), torch.arange(n)[None])
    raw = k_proj_out.view(1, n, N_KV_HEADS, d).transpose(1, 2)
    _, roped = apply_rotary_pos_emb(raw, raw, cos, sin)
    assert torch.allclose(roped[0].to(torch.float64), keys, rtol=0, atol=1e-5), "cached keys are not post-RoPE"

    rbar = mean_rope(rotary_emb, n, future)
    scores, (mubar, sigmabar, z) = expected_attention(queries, keys, values, rbar, sinks, True, True)
    q, k, v, r = queries.numpy(), keys.numpy(), values.numpy(), rbar.numpy()
    group = N_HEADS // N_KV_HEADS
    probs = np.empty((N_HEADS, n - sinks))
    for h in range(N_HEADS):
        rows = q[sinks:, h * d:(h + 1) * d]
        mu = rows.mean(axis=0)
        sigma = np.cov(rows, rowvar=False, bias=True)
        mb, sb = r @ mu, r @ sigma @ r.T
        assert np.allclose(mb, mubar[h].numpy(), rtol=1e-12, atol=1e-12)
        assert np.allclose(sb, sigmabar[h].numpy(), rtol=1e-12, atol=1e-12)
        kh = k[h // group, sinks:]
        zh = kh @ mb / np.sqrt(d) + np.einsum("ei,ij,ej->e", kh, sb, kh) / (2 * d)
        for e in list(range(0, n - sinks, 37)) + [n - sinks - 1]:
            lin = sum(mb[i] * kh[e, i] for i in range(d)) / np.sqrt(d)
            quad = sum(kh[e, i] * sb[i, j] * kh[e, j] for i in range(d) for j in range(d)) / (2 * d)
            assert abs(lin + quad - z[h, e].item()) <= 1e-11 * max(1.0, abs(lin + quad)), (h, e, lin + quad)
        assert np.allclose(zh, z[h].numpy(), rtol=1e-12, atol=1e-12)
        ez = np.exp(zh - zh.max())
        probs[h] = ez / ez.sum()
    ref = probs.reshape(N_KV_HEADS, group, n - sinks).mean(axis=1) * np.linalg.norm(v[:, sinks:], axis=-1)
    assert np.allclose(ref, scores.numpy(), rtol=1e-12, atol=0), "scores differ from numpy's"


def answer_start_text(model_path):
    """What the GGUF's own chat template puts after a user message's content when rendered with
    add_generation_prompt: the end of the user turn and the opening of the assistant turn."""
    template = gguf.GGUFReader(str(model_path)).fields["tokenizer.chat_template"].contents()
    marker = "@@KVZIP-USER-CONTENT@@"
    rendered = jinja2.Environment().from_string(template).render(
        messages=[{"role": "user", "content": marker}], add_generation_prompt=True)
    assert rendered.count(marker) == 1, rendered
    return rendered.split(marker)[1]


def kvzip_scoring_ids(tokenizer, ids, answer_start):
    """(scoring ids, instruction ids, answer_start ids): instruction + ids[:h] + answer_start + ids, h = min(8, n).
    Special-token strings (the chat template's) are parsed into their single ids."""
    instruction = tokenizer.encode(KVZIP_INSTRUCTION, add_special_tokens=False).ids
    answer = tokenizer.encode(answer_start, add_special_tokens=False).ids
    return instruction + ids[:min(KVZIP_HEAD, len(ids))] + answer + ids, instruction, answer


def kvzip_scores(model, ids, scoring_ids, check_layers):
    """One forward pass over ids + scoring_ids (no cache, no output_attentions). Returns (scores: per layer
    [n_kv_heads, n] float64, the MAX over the scoring rows [n, n + R) and then over each KV head's query heads of
    P[head][row][entry] for the entries [0, n); checked: per layer in check_layers, the full P [heads, N, N] (fp32)
    and q_proj's and k_proj's outputs [N, ...] (fp32), for check_kvzip)."""
    n = len(ids)
    group = N_HEADS // N_KV_HEADS
    scores = [None] * N_LAYERS
    checked = {layer: {} for layer in check_layers}
    hooks = []

    def reduce(layer, output):
        probs = output[1].detach()[0]  # [heads, N, N], eager attention's softmax in fp32
        per_head = probs[:, n:, :n].amax(dim=1)  # [heads, n]: max over the scoring rows
        scores[layer] = per_head.view(N_KV_HEADS, group, n).amax(dim=1).to(torch.float64)  # max over the group
        if layer in checked:
            checked[layer]["P"] = probs.clone()

    for layer in range(N_LAYERS):
        attn = model.model.layers[layer].self_attn
        hooks.append(attn.register_forward_hook(lambda _m, _i, o, layer=layer: reduce(layer, o)))
        if layer in checked:
            for kind, proj in (("q", attn.q_proj), ("k", attn.k_proj)):
                hooks.append(proj.register_forward_hook(
                    lambda _m, _i, o, kind=kind, layer=layer: checked[layer].__setitem__(kind, o.detach()[0].clone())))
    try:
        with torch.no_grad():
            model(torch.tensor([ids + scoring_ids]), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert all(s is not None and tuple(s.shape) == (N_KV_HEADS, n) for s in scores)
    return scores, checked


def check_kvzip(rotary_emb, layer_scores, checked, n, rows):
    """Self-checks of one layer's KVzip arithmetic, a second way each: the scoring rows `rows` of P recomputed in
    float64 (softmax over the keys [0, row] of q.k / sqrt(d), q and k from q_proj's and k_proj's outputs rotated with
    transformers' apply_rotary_pos_emb at their positions, cos/sin from the model's rotary embedding) against the
    probabilities the scores came from; and the scores recomputed with numpy from the layer's full P. Returns the
    largest absolute and relative (over probabilities above 1e-6) differences of the recomputed rows."""
    probs = checked["P"]  # [heads, N, N] fp32
    total = probs.shape[-1]
    d = HEAD_DIM
    cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float32), torch.arange(total)[None])
    cos, sin = cos.to(torch.float64), sin.to(torch.float64)  # [1, N, d]
    q = checked["q"].to(torch.float64).view(1, total, N_HEADS, d).transpose(1, 2)  # [1, heads, N, d]
    k = checked["k"].to(torch.float64).view(1, total, N_KV_HEADS, d).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    q, k = q[0].numpy(), k[0].numpy()
    p = probs.to(torch.float64).numpy()
    worst_abs = worst_rel = 0.0
    for h in range(N_HEADS):
        kh = k[h // (N_HEADS // N_KV_HEADS)]
        for r in rows:
            logits = kh[:r + 1] @ q[h, r] / np.sqrt(d)
            ref = np.exp(logits - logits.max())
            ref /= ref.sum()
            assert np.all(p[h, r, r + 1:] == 0), (h, r, "attends past its position")
            diff = np.abs(ref - p[h, r, :r + 1])
            worst_abs = max(worst_abs, float(diff.max()))
            big = ref > 1e-6
            worst_rel = max(worst_rel, float((diff[big] / ref[big]).max()))
            assert np.allclose(p[h, r, :r + 1], ref, rtol=1e-4, atol=1e-7), (h, r, float(diff.max()))
    ref = p[:, n:, :n].max(axis=1).reshape(N_KV_HEADS, N_HEADS // N_KV_HEADS, n).max(axis=1)
    assert np.array_equal(ref, layer_scores.numpy()), "scores differ from numpy's"
    return worst_abs, worst_rel


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--out", default=str(ROOT / "tests/fixtures/selections"))
    args = parser.parse_args()

    model_path = Path(args.model)
    if not model_path.exists():
        sys.exit(f"{model_path} is missing: run tools/setup.sh to fetch it")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    tokenizer = build_reference_tokenizer(str(model_path))
    text = (ROOT / TEXT).read_text(encoding="utf-8")

    model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                 dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (N_LAYERS, N_HEADS,
                                                                                         N_KV_HEADS), cfg
    assert cfg.hidden_size // cfg.num_attention_heads == HEAD_DIM, cfg
    versions = {p: version(p) for p in ("torch", "transformers", "gguf", "tokenizers", "numpy")}
    versions["python"] = sys.version.split()[0]
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    model_info = {"file": model_path.name, "sha256": sha256(model_path)}
    answer_start = answer_start_text(model_path)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, heading, n_tokens in PROMPTS:
        ids = prompt_ids(tokenizer, text, heading, n_tokens)
        n = len(ids)
        # The queries before RoPE (q_proj's output) and, for the self-check, the keys before RoPE, from the same
        # forward pass that gives the attention probabilities and the cache.
        captured = {"q": [None] * N_LAYERS, "k": [None] * N_LAYERS}
        hooks = []
        for layer in range(N_LAYERS):
            attn = model.model.layers[layer].self_attn
            for kind, proj in (("q", attn.q_proj), ("k", attn.k_proj)):
                hooks.append(proj.register_forward_hook(
                    lambda _m, _i, o, kind=kind, layer=layer: captured[kind].__setitem__(layer, o.detach()[0].clone())))
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_attentions=True, use_cache=True)
        for hook in hooks:
            hook.remove()
        attentions = [a.detach() for a in out.attentions]
        assert len(attentions) == N_LAYERS and tuple(attentions[0].shape) == (1, N_HEADS, n, n)
        queries = [q.to(torch.float64) for q in captured["q"]]  # [n, n_heads * d] each
        cache = out.past_key_values
        keys = [cache.layers[layer].keys[0].to(torch.float64) for layer in range(N_LAYERS)]  # [n_kv_heads, n, d]
        values = [cache.layers[layer].values[0].to(torch.float64) for layer in range(N_LAYERS)]
        assert tuple(queries[0].shape) == (n, N_HEADS * HEAD_DIM) and tuple(keys[0].shape) == (N_KV_HEADS, n,
                                                                                                HEAD_DIM)
        rotary = model.model.rotary_emb
        for layer in (0, N_LAYERS - 1):
            check_expected_attention(rotary, queries[layer], keys[layer], values[layer], captured["k"][layer], n, 4,
                                     512)
        # KVzip: a second forward pass, the prompt followed by its scoring ids.
        scoring_ids, instruction_ids, answer_start_ids = kvzip_scoring_ids(tokenizer, ids, answer_start)
        kv_check_layers = (0, N_LAYERS - 1)
        kv_scores, kv_checked = kvzip_scores(model, ids, scoring_ids, kv_check_layers)
        r_len = len(scoring_ids)
        print(f"{name}: KVzip scoring ids: R = {r_len} (instruction {instruction_ids}, the first {min(KVZIP_HEAD, n)} "
              f"prompt ids, answer_start {answer_start_ids} = {answer_start!r}, the {n} prompt ids)")
        # The first row of each piece (instruction, head, answer_start, repeated prompt), one in the middle, the last.
        kv_rows = sorted({n, n + len(instruction_ids), n + len(instruction_ids) + min(KVZIP_HEAD, n),
                          n + (r_len - n), n + r_len - n // 2, n + r_len - 1})[:KVZIP_CHECK_ROWS]
        for layer in kv_check_layers:
            worst_abs, worst_rel = check_kvzip(rotary, kv_scores[layer], kv_checked[layer], n, kv_rows)
            print(f"{name}: KVzip self-check, layer {layer}, rows {kv_rows}: float64 P within {worst_abs:.3g} "
                  f"absolute, {worst_rel:.3g} relative (P > 1e-6)")
        del kv_checked
        sums = {}
        rbars = {}
        policies = []
        for spec, p in configs():
            entry = {"spec": spec, "method": p["method"], "budget": p["budget"]}
            if p["method"] == "streaming":
                recent = p["budget"] - p["sinks"]
                entry["kept"] = ranges(list(range(p["sinks"])) + list(range(n - recent, n)))
                policies.append(entry)
                continue
            if p["method"] == "expected_attention":
                sinks, keep = p["sinks"], p["budget"] - p["sinks"]
                assert n > p["budget"] and 0 <= keep < n - sinks, (spec, n)
                if p["future"] not in rbars:
                    rbars[p["future"]] = mean_rope(rotary, n, p["future"])
                entry.update(sinks=sinks, future=p["future"], keep_per_layer=[keep] * N_LAYERS)
                layers = []
                for layer in range(N_LAYERS):
                    scores, _ = expected_attention(queries[layer], keys[layer], values[layer], rbars[p["future"]],
                                                   sinks, p["covariance"], p["vnorm"])
                    layers.append([select(scores[g].numpy(), keep, n, 0, sinks) for g in range(N_KV_HEADS)])
                entry["layers"] = layers
                policies.append(entry)
                continue
            if p["method"] == "kvzip":
                sinks, keep = p["sinks"], p["budget"] - p["sinks"]
                assert n > p["budget"] and 0 <= keep < n - sinks, (spec, n)
                entry.update(sinks=sinks, scoring_ids=scoring_ids, instruction_ids=instruction_ids,
                             answer_start_ids=answer_start_ids, keep_per_layer=[keep] * N_LAYERS)
                entry["layers"] = [[select(kv_scores[layer][g, sinks:].numpy(), keep, n, 0, sinks)
                                    for g in range(N_KV_HEADS)] for layer in range(N_LAYERS)]
                policies.append(entry)
                continue
            w = p["window"]
            if w not in sums:
                sums[w] = window_sums(attentions, n, w)
            entry["window"] = w
            layers, keeps = [], []
            for layer in range(N_LAYERS):
                if p["method"] == "pyramidkv":
                    keep = pyramid_budget_official(layer, N_LAYERS, n, p["budget"], w, p["beta"])
                else:
                    keep = p["budget"] - w if n >= p["budget"] else None
                assert keep is not None and 0 <= keep < n - w, (spec, layer, keep)
                keeps.append(keep)
                layers.append([select(pool(sums[w][layer][g], p["kernel"], p["pool"]), keep, n, w)
                               for g in range(N_KV_HEADS)])
            entry["keep_per_layer"] = keeps
            entry["layers"] = layers
            policies.append(entry)
        record = {"name": name, "source": f"{TEXT}: the first {n} tokens from {heading!r}", "n": n, "prompt_ids": ids,
                  "n_layers": N_LAYERS, "n_heads": N_HEADS, "n_kv_heads": N_KV_HEADS, "band_rel": BAND_REL,
                  "model": model_info, "versions": versions, "command": command, "policies": policies}
        # One top-level key per line; each policy on its own line.
        lines = []
        for key, value in record.items():
            if key == "policies":
                body = ",\n".join("  " + json.dumps(v, separators=(",", ":")) for v in value)
                lines.append(f' "policies": [\n{body}\n ]')
            else:
                lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
        path = out_dir / f"{name}.json"
        path.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
        margins = [h["margin_rel"] for pol in policies for layer in pol.get("layers", []) for h in layer]
        print(f"{name}: {n} tokens, {path.stat().st_size} bytes, {len(margins)} (policy, layer, KV head) cuts: "
              f"{sum(m == 0 for m in margins)} inside an exact tie (decided by the index rule), "
              f"{sum(0 < m < 1e-4 for m in margins)} with a relative margin in (0, 1e-4), "
              f"smallest non-zero margin {min(m for m in margins if m > 0):.3g}")
        for method in dict.fromkeys(pol["method"] for pol in policies if "layers" in pol):
            margins = [h["margin_rel"] for pol in policies if pol["method"] == method for layer in pol["layers"]
                       for h in layer]
            print(f"  {method}: {len(margins)} cuts, {sum(m == 0 for m in margins)} exact ties, "
                  f"{sum(0 < m < 1e-4 for m in margins)} in (0, 1e-4), smallest margin {min(margins):.3g}")


if __name__ == "__main__":
    main()
