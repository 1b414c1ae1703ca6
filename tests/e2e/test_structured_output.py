"""Structured output through the unchanged openai client (docs/structured-output.md): JSON mode, JSON Schemas and
forced tool calls on SmolLM2, at temperature 0 and 1, whole and streamed; every answer is checked with Python's
jsonschema, an implementation independent of Strata's grammar. Also: schemas drawn at random from a generator
always give valid documents, requests with and without a schema share a batch without changing the unconstrained
one's tokens, and bad schemas or tool choices get 400 naming the field."""
import json
import random
import threading

import jsonschema
import pytest
import requests

from support import chat_logprob_ids, check_greedy_against_reference, error_of, load_reference

CHAT = "/v1/chat/completions"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "address"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
                                                   "required": ["zone"]}},
}


def ask(text):
    return [{"role": "user", "content": text}]


def person_format(schema=PERSON):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def test_json_mode_returns_an_object(client, model_name):
    response = client.chat.completions.create(model=model_name, messages=ask("Describe a cat as JSON."),
                                              response_format={"type": "json_object"}, max_tokens=300,
                                              temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


def test_json_mode_samples_objects(client, model_name):
    """Sampled, json_object mode bounds no length: a draw may still be inside its object at max_tokens (about half of
    SmolLM2's are; which ones depends on the last bits of the logits, and so on the prefix cache's state). Every
    draw that stops is an object, and one at least stops."""
    stopped = []
    for seed in range(7, 13):
        choice = client.chat.completions.create(model=model_name, messages=ask("Describe a cat as JSON."),
                                                response_format={"type": "json_object"}, max_tokens=300,
                                                temperature=1, seed=seed).choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict), choice.message.content
            stopped.append(seed)
    assert stopped


@pytest.mark.parametrize("temperature", [0, 1])
def test_nested_schema_validates(client, model_name, temperature):
    response = client.chat.completions.create(model=model_name, messages=ask("Invent a person with an address."),
                                              response_format=person_format(), max_tokens=300,
                                              temperature=temperature, seed=11, n=2)
    assert sorted(choice.index for choice in response.choices) == [0, 1]
    for choice in response.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_streamed_schema_validates(client, model_name):
    stream = client.chat.completions.create(model=model_name, messages=ask("Invent a person."),
                                            response_format=person_format(), max_tokens=300, temperature=1, seed=3,
                                            stream=True)
    text, reasons = "", []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert reasons == ["stop"]
    jsonschema.validate(json.loads(text), PERSON)


def check_weather_call(message):
    assert message.content is None
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


@pytest.mark.parametrize("temperature", [0, 1])
def test_forced_tool_call(client, model_name, temperature):
    response = client.chat.completions.create(
        model=model_name, messages=ask("What is the weather in Paris?"), tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=200,
        temperature=temperature, seed=5)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    check_weather_call(choice.message)


def test_required_tool_call_picks_an_offered_tool(client, model_name):
    response = client.chat.completions.create(model=model_name, messages=ask("What time is it in Tokyo?"),
                                              tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required",
                                              max_tokens=200, temperature=1, seed=9)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)}
    jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name])


def test_streamed_tool_call(client, model_name):
    stream = client.chat.completions.create(
        model=model_name, messages=ask("What is the weather in Rome?"), tools=[WEATHER_TOOL],
        tool_choice="required", max_tokens=200, temperature=0, stream=True)
    calls, content, reasons = [], "", []
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert content == "" and reasons == ["tool_calls"]
    (call,) = calls
    assert call.index == 0 and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


def test_a_conversation_with_a_call_and_its_result(client, model_name):
    messages = ask("What is the weather in Paris?") + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    response = client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER_TOOL],
                                              tool_choice="none", max_tokens=40, temperature=0)
    choice = response.choices[0]
    assert choice.message.tool_calls is None
    assert choice.message.content


def test_auto_answers_with_content_or_a_valid_call(client, model_name):
    response = client.chat.completions.create(model=model_name, messages=ask("What is the weather in Oslo?"),
                                              tools=[WEATHER_TOOL], max_tokens=120, temperature=0)
    choice = response.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        check_weather_call(choice.message)
    else:
        assert choice.message.content is not None and choice.finish_reason in ("stop", "length")


def test_unconstrained_request_is_unchanged_beside_constrained_ones(client, model_name):
    """A batch mixes masked and unmasked rows: the free request still follows the transformers reference."""
    reference = load_reference("chat_capital")
    errors = []

    def constrained():
        try:
            client.chat.completions.create(model=model_name, messages=ask("Invent a person."),
                                           response_format=person_format(), max_tokens=120, temperature=1, seed=1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=constrained) for _ in range(2)]
    for t in threads:
        t.start()
    response = client.chat.completions.create(model=model_name, messages=reference["messages"], max_tokens=32,
                                              temperature=0, logprobs=True, top_logprobs=1,
                                              extra_body={"ignore_eos": True})
    for t in threads:
        t.join()
    assert not errors, errors
    check_greedy_against_reference(chat_logprob_ids(response.choices[0]), reference, "beside constrained requests")


# Random schemas of the supported subset, with bounds that keep documents short enough to finish.
def random_schema(rng, depth=0):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 2:
        kinds += ["object", "array", "anyOf"]
    kind = rng.choice(kinds)
    if kind == "string":
        schema = {"type": "string", "maxLength": rng.randint(1, 8)}
        if rng.random() < 0.3:
            schema = {"type": "string", "pattern": rng.choice(["^[a-z]{2,4}$", "^[A-Z][0-9]{3}$", "^(yes|no)$"])}
        return schema
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 200)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", 3, None, True, "x y"], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 42, False, {"k": [1, 2]}])}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": rng.randint(0, 1),
                "maxItems": rng.randint(1, 3)}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    names = rng.sample(["alpha", "beta", "gamma", "delta"], rng.randint(1, 3))
    return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": [n for n in names if rng.random() < 0.6]}


@pytest.mark.parametrize("seed", range(8))
def test_random_schemas_sampled_at_temperature_1_validate(client, model_name, seed):
    rng = random.Random(seed)
    schema = random_schema(rng, depth=1) if seed % 2 else {"type": "object", "properties": {
        "value": random_schema(rng)}, "required": ["value"]}
    response = client.chat.completions.create(model=model_name, messages=ask("Answer in JSON."),
                                              response_format={"type": "json_schema",
                                                               "json_schema": {"name": "r", "schema": schema}},
                                              max_tokens=400, temperature=1, seed=seed)
    choice = response.choices[0]
    assert choice.finish_reason == "stop", (schema, choice.message.content)
    jsonschema.validate(json.loads(choice.message.content), schema)


def post_chat(server, **body):
    return requests.post(f"{server.base_url}{CHAT}", json={"messages": ask("hi"), **body}, timeout=60)


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"age": {"type": "integer", "minimum": "ten"}}}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/a"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
])
def test_bad_formats_name_the_field(server, body, param):
    error = error_of(post_chat(server, **body), 400)
    assert error["param"] is not None and error["param"].startswith(param), error
