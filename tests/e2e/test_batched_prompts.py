"""/v1/completions with a batch of prompts ("prompt": ["a", "b"], or lists of token ids), through the openai client
and raw HTTP: each prompt's choices are what the prompt alone gets (greedy, so the same text), in OpenAI's order
(prompt i's choice j is index i * n + j), usage summed over the prompts, streamed as well as whole, with each echo
its own prompt; a batch over server.max_prompts or asking for more sequences than the engine queues, or with one
prompt the engine refuses, is a 400 naming the prompt, and what was already submitted of it is cancelled."""
import json
import time

import requests

from serve_process import ServeProcess
from support import ROOT, check_greedy_against_reference, completion_logprob_ids, load_reference, metric, metrics

GREEDY = {"temperature": 0}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village by the sea,"]


def alone(client, model_name, prompt, **fields):
    return client.completions.create(model=model_name, prompt=prompt, **GREEDY, **fields)


def test_a_batch_answers_each_prompt_as_alone_in_order(client, model_name):
    reference = load_reference("short_text")
    prompts = PROMPTS + [reference["prompt_ids"]]
    batch = client.completions.create(model=model_name, prompt=prompts, max_tokens=8, n=2, logprobs=0, **GREEDY)
    assert [c.index for c in batch.choices] == list(range(2 * len(prompts)))
    singles = [alone(client, model_name, p, max_tokens=8) for p in prompts]
    for i, single in enumerate(singles):
        for j in range(2):
            choice = batch.choices[2 * i + j]
            assert choice.text == single.choices[0].text, (i, j, choice.text, single.choices[0].text)
            assert choice.finish_reason == single.choices[0].finish_reason
    # The token-id prompt against transformers' greedy tokens.
    check_greedy_against_reference(completion_logprob_ids(batch.choices[-1]), reference, "batched token-id prompt")
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert batch.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    assert batch.usage.total_tokens == batch.usage.prompt_tokens + batch.usage.completion_tokens


def test_a_streamed_batch_carries_every_choice_and_the_summed_usage(server, client, model_name):
    response = requests.post(f"{server.base_url}/v1/completions", timeout=300, stream=True,
                             json={"model": model_name, "prompt": PROMPTS, "max_tokens": 6, "echo": True,
                                   "stream": True, "stream_options": {"include_usage": True}, **GREEDY})
    assert response.status_code == 200, response.text
    texts, finishes, usage = {}, {}, None
    for line in response.iter_lines():
        if not line:
            continue
        data = line.decode("utf-8").removeprefix("data: ")
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
            if choice["finish_reason"]:
                finishes[choice["index"]] = choice["finish_reason"]
    assert sorted(texts) == sorted(finishes) == list(range(len(PROMPTS)))
    whole = client.completions.create(model=model_name, prompt=PROMPTS, max_tokens=6, echo=True, **GREEDY)
    for choice in whole.choices:
        assert choice.text.startswith(PROMPTS[choice.index])  # its own prompt, echoed
        assert texts[choice.index] == choice.text
    assert usage["prompt_tokens"] == whole.usage.prompt_tokens
    assert usage["completion_tokens"] == whole.usage.completion_tokens


def test_a_bad_prompt_in_a_batch_is_named(server, model_name):
    def error(prompt, **fields):
        response = requests.post(f"{server.base_url}/v1/completions", timeout=60,
                                 json={"model": model_name, "prompt": prompt, **fields})
        assert response.status_code == 400, response.text
        return response.json()["error"]

    assert error(["Hi", "x" * 40000], max_tokens=4)["param"] == "prompt[1]"  # beyond the context
    assert error(["Hi", [1, 99999]])["param"] == "prompt[1]"  # outside the vocabulary
    assert error(["Hi", 7])["param"] == "prompt[1]"
    too_many = error(["Hi"] * 65)  # configs/smollm2-cpu.yaml: server.max_prompts 64
    assert too_many["param"] == "prompt" and "64" in too_many["message"], too_many
    # 17 x 16 = 272 sequences, beyond engine.max_waiting (256): a request that could never be queued.
    never = error(["Hi"] * 17, n=16, max_tokens=1)
    assert never["param"] == "prompt" and "(256)" in never["message"], never


def test_a_prompt_the_engine_refuses_cancels_the_ones_submitted_before_it(model_name):
    """A 16 MiB pool holds a few hundred tokens: the engine refuses a longer prompt when it is submitted, after the
    batch's first prompt already was. That one must not go on generating for nobody."""
    small = ServeProcess(["kv_cache.memory_mib=16"], "strata serve (16 MiB pool)").wait_ready()
    try:
        long_prompt = (ROOT / "tests" / "fixtures" / "texts" / "a_coastal_almanac.txt").read_text(encoding="utf-8")
        generated_before = metric(metrics(small.base_url), "strata_generation_tokens_total")
        response = requests.post(f"{small.base_url}/v1/completions", timeout=60,
                                 json={"model": model_name, "prompt": ["Hi", long_prompt[:3000]], "max_tokens": 200,
                                       "ignore_eos": True, **GREEDY})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "prompt[1]"
        assert "KV blocks" in response.json()["error"]["message"]
        deadline = time.monotonic() + 30
        while requests.get(f"{small.base_url}/v1/kv_state", timeout=30).json()["sequences"]:
            assert time.monotonic() < deadline, "the batch's first prompt is still running"
            time.sleep(0.1)
        generated = metric(metrics(small.base_url), "strata_generation_tokens_total") - generated_before
        assert generated < 50, generated  # uncancelled, it would have generated 200
        ok = requests.post(f"{small.base_url}/v1/completions", timeout=60,
                           json={"model": model_name, "prompt": ["Hi", "Hello"], "max_tokens": 2})
        assert ok.status_code == 200, ok.text
        assert len(ok.json()["choices"]) == 2
    finally:
        small.stop()
