"""POST /tokenize and /detokenize against the real model: a text's ids are the reference tokenizer's (tokenizers,
built from the same GGUF), a chat's count is the prompt_tokens a chat completion of the same messages reports, the
ids of a prompt longer than the context are counted all the same, and /detokenize gives the text back."""
import requests

from support import encode_without_specials, tokenizer

TEXT = "The lighthouse keeper counted 1,234 ships: schooners, brigs and one steam-packet."


def post(server, path, body):
    response = requests.post(f"{server.base_url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_texts_ids_are_the_reference_tokenizers(server, model_name):
    out = post(server, "/tokenize", {"model": model_name, "prompt": TEXT, "return_token_strs": True})
    assert out["tokens"] == encode_without_specials(tokenizer(), TEXT)
    assert out["count"] == len(out["tokens"])
    assert "".join(out["token_strs"]) == TEXT
    assert post(server, "/detokenize", {"tokens": out["tokens"]})["prompt"] == TEXT


def test_a_chats_count_is_what_generation_reports(server, model_name):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    out = post(server, "/tokenize", {"messages": messages})
    completion = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert out["count"] == completion["usage"]["prompt_tokens"]
    text = post(server, "/detokenize", {"tokens": out["tokens"]})["prompt"]
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>") and text.endswith("<|im_start|>assistant\n")


def test_a_prompt_beyond_the_context_is_counted(server):
    out = post(server, "/tokenize", {"prompt": TEXT * 400})
    assert out["count"] > out["max_model_len"]
    refused = requests.post(f"{server.base_url}/v1/completions", json={"prompt": TEXT * 400}, timeout=60)
    assert refused.status_code == 400 and str(out["count"]) in refused.json()["error"]["message"]
