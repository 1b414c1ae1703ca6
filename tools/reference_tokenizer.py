"""The independent reference for Strata's tokenizer: Hugging Face `tokenizers`, built from a GGUF file.

build_reference_tokenizer(gguf_path) reads the vocabulary and merges with the `gguf` package and configures the
tokenizer as SmolLM2's tokenizer.json does (../shared/specs/model_format.md, sections 5-6): no normalizer;
pre-tokenizer Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]; BPE
without unk or dropout (so characters with no token are dropped, as HF does); ByteLevel decoder; the control
tokens (ids 0-16 for SmolLM2) as added special tokens.

    tok = build_reference_tokenizer("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    tok.encode(text, add_special_tokens=False).ids          # special-token strings in text are parsed
    encode_without_specials(tok, text)                       # ... or encoded as ordinary text

Run as a script to print the ids of each argument: python tools/reference_tokenizer.py MODEL.gguf "text" ...
"""
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# GGUF tokenizer.ggml.token_type values that HF treats as added special tokens.
_CONTROL = 3
_USER_DEFINED = 4


def _field(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def build_reference_tokenizer(gguf_path):
    reader = GGUFReader(gguf_path)
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{gguf_path}: tokenizer.ggml.model is {model!r}, only 'gpt2' (byte-level BPE) is supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    token_types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    pre = _field(reader, "tokenizer.ggml.pre") or "gpt2"

    vocab = {text: i for i, text in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, fuse_unk=False,
                                     byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    specials = [AddedToken(text, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
                for text, kind in zip(tokens, token_types) if kind in (_CONTROL, _USER_DEFINED)]
    tokenizer.add_special_tokens(specials)
    return tokenizer


def encode_without_specials(tokenizer, text):
    """Ids of text with special-token strings treated as ordinary text (Strata's parse_special = false)."""
    tokenizer.encode_special_tokens = True  # HF: do not split special tokens off; let the model encode them
    try:
        return tokenizer.encode(text, add_special_tokens=False).ids
    finally:
        tokenizer.encode_special_tokens = False


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: reference_tokenizer.py MODEL.gguf [TEXT ...]")
    reference = build_reference_tokenizer(sys.argv[1])
    for arg in sys.argv[2:]:
        print(reference.encode(arg, add_special_tokens=False).ids)
