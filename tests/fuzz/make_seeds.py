#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer harnesses (tests/fuzz/corpus/<harness>/): a few small valid inputs
each, written from the formats' descriptions (../shared/specs/model_format.md; parallel/step_plan.cpp and
parallel/rank_report.cpp for the wire), so that the fuzzers start from inputs that reach deep into each parser.
Run from anywhere: `.venv/bin/python tests/fuzz/make_seeds.py`; the files are committed."""
import json
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"


def gguf_string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_kv(key, type_id, payload):
    return gguf_string(key) + struct.pack("<I", type_id) + payload


def gguf_string_array(key, items):
    return gguf_kv(key, 9, struct.pack("<IQ", 8, len(items)) + b"".join(gguf_string(i) for i in items))


def tiny_gguf(with_tensor):
    """A GGUF v3 file with a five-token byte-level BPE vocabulary and, optionally, one 4x2 f32 tensor."""
    kvs = [gguf_kv("general.architecture", 8, gguf_string("llama")),
           gguf_kv("general.alignment", 4, struct.pack("<I", 32)),
           gguf_kv("tokenizer.ggml.model", 8, gguf_string("gpt2")),
           gguf_string_array("tokenizer.ggml.tokens", ["a", "b", "ab", "Ġ", "<|im_end|>"]),
           gguf_kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 5) + struct.pack("<5i", 1, 1, 1, 1, 3)),
           gguf_string_array("tokenizer.ggml.merges", ["a b"]),
           gguf_kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 4)),
           gguf_kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0))]
    tensors = [gguf_string("token_embd.weight") + struct.pack("<I2QIQ", 2, 4, 2, 0, 0)] if with_tensor else []
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(tensors)
    if not with_tensor:
        return header
    header += b"\0" * (-len(header) % 32)
    return header + struct.pack("<8f", *range(8))


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def wire_string(text):
    return struct.pack("<I", len(text)) + text.encode()


def wire_vector(fmt, items):
    return struct.pack("<I", len(items)) + b"".join(struct.pack("<" + fmt, i) for i in items)


def step_plan():
    logit_bias = struct.pack("<I", 1) + struct.pack("<if", 50, -100.0)
    sampling = struct.pack("<ffifffi", 0.7, 0.9, 40, 0.0, 0.0, 0.0, -1) + logit_bias
    policy = b"\1" + wire_string("snapkv") + struct.pack("<I", 1) + wire_string("budget") + wire_string("64")
    added = struct.pack("<q", 3) + sampling + struct.pack("<Q", 42) + policy + struct.pack("<i", 5)
    started = struct.pack("<q", 3) + wire_vector("Q", [11, 12]) + struct.pack("<iB", 5, 0)
    # The tokens a work item may sample, in two of the wire's forms: the bitset, and the list of allowed ids.
    bits = b"\1" + wire_vector("Q", [0xFFFF0000FFFF0001, 0x1])
    allowed = b"\2" + struct.pack("<I", 2) + wire_vector("i", [3, 70])
    work = (struct.pack("<qi", 3, 0) + wire_vector("i", [1, 2, 3, 4, 5]) + struct.pack("<Bi", 1, 5) + bits
            + struct.pack("<qi", 4, 9) + wire_vector("i", [6]) + struct.pack("<Bi", 1, 0) + allowed)
    return (struct.pack("<IQBB", 0x4E4C5053, 7, 0, 1) + struct.pack("<I", 1) + added + wire_vector("q", [1])
            + wire_vector("q", [2]) + wire_vector("Q", [99]) + struct.pack("<I", 1) + started
            + struct.pack("<I", 1) + struct.pack("<qiQ", 3, 0, 12345) + struct.pack("<I", 2) + work)


def step_result():
    top = struct.pack("<I", 2) + struct.pack("<if", 17, -0.5) + struct.pack("<if", 18, -1.5)
    return struct.pack("<IQI", 0x53455253, 7, 1) + struct.pack("<qif", 3, 17, -0.5) + top


def observations(items):
    """Named values (cache/observation.h): name, value, kind (0 count, 1 amount, 2 verdict)."""
    return struct.pack("<I", len(items)) + b"".join(wire_string(n) + struct.pack("<qB", v, k) for n, v, k in items)


def rank_report():
    layer = (struct.pack("<10q", 5, 1, 0, 0, 0, 0, 0, 4096, 4096, 0) + struct.pack("<q", 2)
             + observations([("merged_tokens", 2, 0), ("codebook_vectors", 7, 1)]))
    sequence = struct.pack("<q", 3) + wire_vector("i", [5, 5]) + wire_vector("i", [1, 1]) + struct.pack("<q", 2)
    detail_layer = (wire_string("d2o") + struct.pack("<i", 5)
                    + observations([("lazy", 1, 2), ("capacity", 4, 1), ("codebook.keys", 3, 1)]))
    detail = struct.pack("<qI", 3, 2) + detail_layer + detail_layer
    result = step_result()
    return (struct.pack("<IQiiiiiqqq", 0x54525053, 7, 0, 0, 0, 0, 16, 4096, 10, 12) + struct.pack("<I", 2)
            + layer + layer + struct.pack("<I", 1) + sequence + struct.pack("<I", 1) + detail
            + struct.pack("<I", len(result)) + result + wire_string(""))


def http_request(method, target, body=b"", headers=""):
    head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\n{headers}"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


COMPLETION = json.dumps({"model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is", "max_tokens": 4,
                         "temperature": 0, "logprobs": 2, "echo": True}).encode()
CHAT = json.dumps({"model": "SmolLM2-135M-Instruct", "messages": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Name a colour."}], "max_tokens": 8, "stream": True, "n": 2,
                   "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2}).encode()
TOKENS = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2, "stop": ["\n"], "seed": 5,
                     "kv_compression": {"policy": "pyramidkv", "budget": "20%"}}).encode()
CHAT_TOOLS = json.dumps({"messages": [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}, {"role": "user", "content": "And Rome?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "tool_choice": "required", "max_tokens": 16}).encode()
BATCH = json.dumps({"prompt": ["The capital of France is", [1, 2, 3]], "n": 2, "max_tokens": 2, "min_tokens": 1,
                    "echo": True, "stream": True}).encode()
CHAT_SCHEMA = json.dumps({"messages": [{"role": "user", "content": "A person."}], "max_tokens": 16, "stream": True,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                              "schema": {"type": "object", "properties": {"age": {"type": "integer", "maximum": 9}},
                                         "required": ["age"]}}}}).encode()

SEEDS = {
    "gguf_fuzz": {"header_only": tiny_gguf(False), "one_tensor": tiny_gguf(True)},
    "safetensors_fuzz": {
        "two_tensors": safetensors({"a": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                                    "b": ("BF16", [2], b"\0\x3f\0\x40")}, {"format": "pt"}),
        "empty": safetensors({}),
    },
    "tokenizer_fuzz": {"english": "The capital of France is Paris. 12345!".encode(),
                       "mixed": "héllo wörld 日本語 <|im_end|>\n\n  tabs\tand 🙂".encode(),
                       "invalid_utf8": b"ab\xff\xc3(\xe2\x82"},
    "chat_template_fuzz": {"chat": b"\x04system\x1fBe brief.\x1euser\x1fHi\x1eassistant\x1fHello\x1euser\x1fBye",
                           "llama3": b"\x0duser\x1f  padded  \x1eassistant\x1fok",
                           "mistral_jinja": b"\x02{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"},
    "openai_request_fuzz": {"completion": b"\0" + COMPLETION, "chat": b"\1" + CHAT, "token_ids": b"\2" + TOKENS,
                            "chat_tools": b"\1" + CHAT_TOOLS, "chat_schema": b"\1" + CHAT_SCHEMA,
                            "batch": b"\0" + BATCH},
    "http_session_fuzz": {
        "completion": http_request("POST", "/v1/completions", COMPLETION),
        "chat_stream": http_request("POST", "/v1/chat/completions", CHAT),
        "pipelined_gets": http_request("GET", "/health") + http_request("GET", "/v1/models")
                          + http_request("GET", "/metrics", headers="Connection: close\r\n"),
        "http10_stream": http_request("POST", "/v1/chat/completions", CHAT).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
        "expect_continue": http_request("POST", "/v1/completions", TOKENS, "Expect: 100-continue\r\n"),
        "batch": http_request("POST", "/v1/completions", BATCH),
        "tokenize": http_request("POST", "/tokenize", json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                                                   "return_token_strs": True}).encode())
                    + http_request("POST", "/detokenize", b'{"tokens": [1, 2, 3]}')
                    + http_request("GET", "/v1/models/SmolLM2-135M-Instruct"),
    },
    "json_schema_fuzz": {
        "person": b"\0" + json.dumps({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 8, "pattern": "^[A-Z][a-z]+$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", 3, None]}, "minItems": 1, "maxItems": 3}},
            "required": ["name"]}).encode(),
        "any_of": b"\1" + json.dumps({"anyOf": [{"type": "number", "exclusiveMinimum": -1.5, "maximum": 2.25},
                                                 {"const": {"k": [True, "x"]}}, {"type": ["null", "boolean"]}]}).encode(),
        "json_object": b"\2" + json.dumps({"type": "object"}).encode(),
    },
    "step_plan_fuzz": {"plan": step_plan(), "result": step_result()},
    "rank_report_fuzz": {"report": rank_report()},
    "server_config_fuzz": {"smollm2_cpu": (ROOT / "configs" / "smollm2-cpu.yaml").read_bytes(),
                           "overrides": b"kv_cache:\n  policy: pyramidkv:budget=128\n"
                                        b"  layer_overrides: 0-1=full;28-29=snapkv:budget=20%\n"
                                        b"  request_policies: full, snapkv\nserver: {port: 9000, threads: 4}\n",
                           "twice": b"server:\n  api_keys: [sk-a]\n  port: 8000\n  api_keys: []\n"
                                    b"engine: {threads: 1}\nengine: {threads: 2}\n"},
}


def main():
    for harness, seeds in SEEDS.items():
        folder = CORPUS / harness
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
    print(f"wrote {sum(len(s) for s in SEEDS.values())} seeds under {CORPUS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
