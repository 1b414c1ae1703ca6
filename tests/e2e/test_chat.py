"""/v1/chat/completions through the openai client: the ChatML prompt, greedy output against the transformers
reference for 64 tokens, end-of-sequence, logprobs, n and seeds."""
import math

import pytest

from support import STOP_IDS, chat_logprob_ids, check_greedy_against_reference, decode, load_reference

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def reference():
    return load_reference("chat_capital")


def test_greedy_64_tokens_match_reference(client, model_name, reference):
    # ignore_eos (a vLLM extension): the reference keeps going past <|im_end|>, so all 64 steps are compared.
    response = client.chat.completions.create(model=model_name, messages=reference["messages"], max_tokens=64,
                                              temperature=0, logprobs=True, top_logprobs=1,
                                              extra_body={"ignore_eos": True})
    choice = response.choices[0]
    ids = chat_logprob_ids(choice)
    assert len(ids) == 64
    check_greedy_against_reference(ids, reference, "chat chat_capital")
    assert choice.finish_reason == "length"
    assert response.usage.prompt_tokens == len(reference["prompt_ids"])
    assert response.usage.completion_tokens == 64


def test_greedy_stops_at_eos_with_logprobs(client, model_name, reference):
    response = client.chat.completions.create(model=model_name, messages=reference["messages"], max_tokens=32,
                                              temperature=0, logprobs=True, top_logprobs=3)
    choice = response.choices[0]
    greedy = reference["greedy_ids"]
    n_answer = next(i for i, t in enumerate(greedy) if t in STOP_IDS)
    assert n_answer < 32, "the reference answer is expected to end well within 32 tokens"
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == decode(greedy[:n_answer])  # "The capital of France is Paris."
    # The end-of-sequence token is generated, counted and reported like vLLM does, but not part of the text.
    ids = chat_logprob_ids(choice)
    check_greedy_against_reference(ids, reference, "chat chat_capital (stopping at eos)")
    assert ids[-1] in STOP_IDS and len(ids) == n_answer + 1
    assert response.usage.completion_tokens == len(ids)
    assert response.usage.prompt_tokens == len(reference["prompt_ids"])

    for entry in choice.logprobs.content:
        assert entry.logprob <= 0.0
        assert bytes(entry.bytes) == entry.token.encode("utf-8")
        top = entry.top_logprobs
        assert len(top) == 3
        values = [t.logprob for t in top]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-4
        # Greedy: the chosen token is the first alternative, with the same logprob.
        assert top[0].token == entry.token and top[0].bytes == entry.bytes
        assert top[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
    # The reference's top-1/top-2 logit margin is a logprob difference too (the log-normaliser cancels).
    first = choice.logprobs.content[0].top_logprobs
    assert first[0].logprob - first[1].logprob == pytest.approx(reference["greedy_margins"][0], abs=2e-3)


def test_explicit_default_system_prompt_gives_the_same_prompt(client, model_name, reference):
    messages = [{"role": "system", "content": DEFAULT_SYSTEM}] + reference["messages"]
    response = client.chat.completions.create(model=model_name, messages=messages, max_tokens=1, temperature=0)
    assert response.usage.prompt_tokens == len(reference["prompt_ids"])
    assert response.choices[0].message.content == decode(reference["greedy_ids"][:1])


def test_n2_with_seed_is_reproducible(client, model_name):
    request = dict(model=model_name, messages=[{"role": "user", "content": "Write a short poem about the sea."}],
                   max_tokens=6, n=2, seed=7, temperature=1.0)
    first = client.chat.completions.create(**request)
    second = client.chat.completions.create(**request)
    assert sorted(c.index for c in first.choices) == [0, 1]
    by_index = lambda response: [c.message.content for c in sorted(response.choices, key=lambda c: c.index)]
    assert by_index(first) == by_index(second)
    assert first.id.startswith("chatcmpl-") and first.object == "chat.completion"
    assert 2 <= first.usage.completion_tokens <= 12
