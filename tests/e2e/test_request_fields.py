"""Every request field is answered honestly, through the real server:
- logit_bias acts on both endpoints: -100 on the greedy first token makes the model choose another, +100 on a token
  makes it the first one, and the logprobs reported are those of the biased distribution;
- the deprecated functions and function_call, tools outside chat, and any other OpenAI field Strata does not
  implement get 400 naming the field (response_format, tools and tool_choice: test_structured_output.py); a field unknown to the OpenAI API gets 400 too, unless the server was started
  with server.ignore_unknown_fields;
- min_tokens masks the end tokens until then, so a short answer goes on with its best other token;
- a kv_compression valid in itself that this server cannot run (pod without kv_cache.pod_blocks) gets 400 naming
  kv_compression.policy before it is queued, instead of failing in the engine."""
import math

import pytest
import requests

from serve_process import ServeProcess
from support import error_of, id_of_bytes

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPT = "The capital of France is"


def post(base_url, path, body):
    return requests.post(f"{base_url}{path}", json=body, timeout=120)


def first_token(server, model_name, **extra):
    """The first generated token's id and the top-2 logprobs of a greedy completion."""
    response = post(server.base_url, COMPLETIONS, {"model": model_name, "prompt": PROMPT, "max_tokens": 3,
                                                   "temperature": 0, "logprobs": 2, **extra})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return id_of_bytes(choice["logprobs"]["tokens"][0].encode("utf-8")), choice["logprobs"]


def test_logit_bias_rules_a_token_out_and_in_on_completions(server, model_name):
    greedy, plain = first_token(server, model_name)
    banned, _ = first_token(server, model_name, logit_bias={str(greedy): -100})
    assert banned != greedy
    forced_id = id_of_bytes(b" Paris") if greedy != id_of_bytes(b" Paris") else id_of_bytes(b" London")
    forced, logprobs = first_token(server, model_name, logit_bias={str(forced_id): 100})
    assert forced == forced_id
    # The logprobs are those of the biased row: the forced token takes almost all the mass.
    assert logprobs["token_logprobs"][0] > math.log(0.99), logprobs
    assert plain["token_logprobs"][0] < logprobs["token_logprobs"][0]


def test_logit_bias_on_chat(server, model_name):
    def chat(**extra):
        response = post(server.base_url, CHAT, {"model": model_name, "max_tokens": 2, "temperature": 0,
                                                "logprobs": True, "top_logprobs": 1,
                                                "messages": [{"role": "user", "content": "Say hello."}], **extra})
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["logprobs"]["content"][0]

    plain = chat()
    plain_id = id_of_bytes(bytes(plain["bytes"]))
    biased = chat(logit_bias={str(plain_id): -100})
    assert biased["token"] != plain["token"], (plain, biased)


@pytest.mark.parametrize("path,field,value", [
    (CHAT, "functions", [{"name": "get_weather", "parameters": {}}]),
    (CHAT, "function_call", "auto"),
    (COMPLETIONS, "tools", [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]),
    (CHAT, "store", True),
    (CHAT, "audio", {"voice": "alloy", "format": "wav"}),
    (COMPLETIONS, "best_of", 2),
    (COMPLETIONS, "suffix", " and that is all."),
    (COMPLETIONS, "not_an_openai_field", 1),
    (CHAT, "not_an_openai_field", {"a": 1}),
])
def test_fields_that_are_not_implemented_get_400_naming_them(server, model_name, path, field, value):
    body = {"model": model_name, "max_tokens": 2, field: value}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if path == CHAT else {"prompt": "hi"})
    error = error_of(post(server.base_url, path, body), 400)
    assert error["param"] == field, error
    assert field in error["message"], error


def test_fields_that_ask_for_nothing_are_accepted(server, model_name):
    body = {"model": model_name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "store": False, "user": "u1"}
    assert post(server.base_url, CHAT, body).status_code == 200


def test_the_operator_may_ignore_unknown_fields(model_name):
    lenient = ServeProcess(["server.ignore_unknown_fields=true"], "strata serve (ignore_unknown_fields)").wait_ready()
    try:
        body = {"model": model_name, "prompt": "hi", "max_tokens": 2, "not_an_openai_field": 1}
        assert post(lenient.base_url, COMPLETIONS, body).status_code == 200
        # OpenAI fields that Strata does not implement are still refused.
        body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}],
                "functions": [{"name": "f"}]}
        assert error_of(post(lenient.base_url, CHAT, body), 400)["param"] == "functions"
    finally:
        lenient.stop()


def test_a_policy_this_server_cannot_run_is_refused_before_it_is_queued(server, model_name):
    body = {"model": model_name, "prompt": "hi", "max_tokens": 2, "kv_compression": {"policy": "pod"}}
    error = error_of(post(server.base_url, COMPLETIONS, body), 400)
    assert error["param"] == "kv_compression.policy", error
    assert "kv_cache.pod_blocks" in error["message"], error
    assert post(server.base_url, COMPLETIONS, {**body, "kv_compression": {"policy": "full"}}).status_code == 200


def test_min_tokens_masks_the_end_until_then(server, model_name):
    """A short greedy answer ends with <|im_end|>; with min_tokens past its length the answer keeps its tokens up to
    there and takes, where it ended, the most likely token that does not end it (the plain answer's second choice
    there), and goes on to at least min_tokens."""
    body = {"model": model_name, "temperature": 0, "max_tokens": 40, "logprobs": True, "top_logprobs": 5,
            "messages": [{"role": "user", "content": "Reply with one word: yes or no. Is water wet?"}]}
    plain = post(server.base_url, CHAT, body).json()
    plain_tokens = plain["choices"][0]["logprobs"]["content"]
    assert plain["choices"][0]["finish_reason"] == "stop"
    ended_at = plain["usage"]["completion_tokens"] - 1  # the step that chose the end token
    assert 0 < ended_at < 10, plain
    longer = post(server.base_url, CHAT, {**body, "min_tokens": 12}).json()
    tokens = longer["choices"][0]["logprobs"]["content"]
    assert longer["usage"]["completion_tokens"] >= 12, longer["usage"]
    assert [t["bytes"] for t in tokens[:ended_at]] == [t["bytes"] for t in plain_tokens[:ended_at]]
    # Where the plain answer ended: its best alternative that is not an end token.
    ends = ("<|im_end|>", "<|endoftext|>")
    alternatives = [t for t in plain_tokens[ended_at]["top_logprobs"] if t["token"] not in ends]
    assert tokens[ended_at]["bytes"] == alternatives[0]["bytes"], (tokens[ended_at], plain_tokens[ended_at])
    assert error_of(post(server.base_url, CHAT, {**body, "min_tokens": 41}), 400)["param"] == "min_tokens"
    assert error_of(post(server.base_url, COMPLETIONS, {"model": model_name, "prompt": PROMPT, "min_tokens": -1}),
                    400)["param"] == "min_tokens"
    schema = {**body, "min_tokens": 3, "response_format": {"type": "json_object"}}
    assert error_of(post(server.base_url, CHAT, schema), 400)["param"] == "min_tokens"
