"""A real Hugging Face-format checkpoint behind a real `modelhost serve`: the OpenAI API through
the official `openai` client, Triton's generate extension and gRPC stream with text, and the
hardening regressions of issue 15 finding 6 (bad generation parameters, a client that drops a
non-streaming request)."""

from __future__ import annotations

import json
import math
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from llm_checkpoints import served_model

from host.testing import ServerProcess, serve, wait_until

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.modelhost_only
MODEL = "chat"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("llm_serve")
    served_model(repo, MODEL, "--max-len", "2048")
    with serve(repo) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


def hf(server: ServerProcess) -> tuple[Any, Any]:
    """`transformers`' model and tokenizer of the served checkpoint (the same files)."""
    path = Path(server.model_repository) / MODEL / "1"
    return (transformers.AutoModelForCausalLM.from_pretrained(path),
            transformers.AutoTokenizer.from_pretrained(path))


def post(server: ServerProcess, path: str, doc: dict) -> tuple[int, Any]:
    req = urllib.request.Request(server.http_url + path, data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = resp.read()
            return resp.status, body
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def metric(server: ServerProcess, name: str, label: str = "") -> float:
    """The sum of the samples of `name` (whose labels include `label`) on /metrics."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in "{ " and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_models_are_listed(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_greedy_completion_is_transformers_greedy(server, client):
    model, tokenizer = hf(server)
    prompt = "The quick brown fox"
    ids = tokenizer(prompt)["input_ids"]
    expected = model.generate(np_tensor(ids), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(ids):].tolist()
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 12)


def np_tensor(ids: list[int]) -> Any:
    import torch

    return torch.tensor([ids])


def test_chat_and_its_stream_agree(server, client):
    _, tokenizer = hf(server)
    messages = [{"role": "user", "content": "Hello, how are you?"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True})
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(prompt_ids, list):
        prompt_ids = prompt_ids["input_ids"]
    assert full.usage.prompt_tokens == len(prompt_ids)
    assert full.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].usage.prompt_tokens == len(prompt_ids)


def test_stop_strings_cut_the_text(client):
    free = client.completions.create(model=MODEL, prompt="Hello", max_tokens=30, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = next(free[i:i + 3] for i in range(4, len(free) - 3) if free[i:i + 3].strip() and
                free.find(free[i:i + 3]) == i)
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=30, temperature=0,
                                  stop=[stop, "\u2603never"], extra_body={"ignore_eos": True})
    assert r.choices[0].text == free[:free.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt="Hello", max_tokens=30, temperature=0,
                                         stop=stop, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == free[:free.find(stop)]


def test_n_choices_seeded_sampling_and_logprobs(client):
    def ask() -> Any:
        return client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, n=3, seed=11,
                                         temperature=1.0, logprobs=2, extra_body={"ignore_eos": True})

    first, again = ask(), ask()
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.text for c in again.choices]  # the seed makes it repeatable
    assert len(set(texts)) > 1  # a temperature alone samples (OpenAI's convention)
    lp = first.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 8 and len(lp.top_logprobs[0]) == 2
    assert all(v <= 0 for v in lp.token_logprobs)
    assert first.usage.completion_tokens == 24


@pytest.mark.parametrize("body, param", [
    ({"temperature": 3}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"),
    ({"n": 0}, "n"), ({"n": 100}, "n"), ({"seed": "x"}, "seed"),
    ({"stop": 5}, "stop"), ({"stop": [""]}, "stop"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"logprobs": 30}, "logprobs"),
    ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 50, "max_tokens": 5}, "min_tokens"),
    ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"prompt": 7}, "prompt"),
    ({"prompt": [10 ** 6]}, None),  # a token id outside the vocabulary: the core refuses it
])
def test_every_parameter_error_is_answered(server, body, param):
    doc = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, **body}
    status, raw = post(server, "/v1/completions", doc)
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if param:
        assert param in error["message"]


def test_chat_errors_and_the_client_raises_them(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=3)
    assert "messages" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       top_logprobs=3)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def test_generate_extension_speaks_text(server, client):
    expected = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
    status, raw = post(server, f"/v2/models/{MODEL}/generate",
                       {"text_input": "Hello", "max_tokens": 6, "ignore_eos": True})
    doc = json.loads(raw)
    assert status == 200 and doc["text_output"] == expected
    assert doc["finish_reason"] == "length" and doc["completion_tokens"] == 6
    status, raw = post(server, f"/v2/models/{MODEL}/generate_stream",
                       {"text_input": "Hello", "max_tokens": 6, "stream": True, "ignore_eos": True})
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert status == 200 and len(events) == 6
    assert "".join(e["text_output"] for e in events) == expected
    # vLLM's sampling_parameters, and TensorRT-LLM's beams
    status, raw = post(server, f"/v2/models/{MODEL}/generate",
                       {"text_input": "Hello", "sampling_parameters": json.dumps(
                           {"max_tokens": 6, "temperature": 0, "ignore_eos": True})})
    assert json.loads(raw)["text_output"] == expected
    status, raw = post(server, f"/v2/models/{MODEL}/generate",
                       {"text_input": "Hello", "max_tokens": 5, "beam_width": 2, "end_id": 0})
    doc = json.loads(raw)
    assert status == 200 and len(doc["text_output"]) == 2 and len(doc["output_ids"]) == 10


def test_grpc_stream_speaks_text(server, client):
    expected = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
    got: list[Any] = []
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: got.append(error or result))
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"Hello"]], dtype=object))
        n = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
        n.set_data_from_numpy(np.array([[5]], np.int32))
        stream = grpcclient.InferInput("stream", [1, 1], "BOOL")
        stream.set_data_from_numpy(np.array([[True]]))
        c.async_stream_infer(MODEL, [text, n, stream], parameters={"ignore_eos": True},
                             enable_empty_final_response=True)
        assert wait_until(lambda: any(_final(r) for r in got), timeout=60)
        c.stop_stream()
    pieces = [r.as_numpy("text_output") for r in got if r.as_numpy("text_output") is not None]
    assert b"".join(p.reshape(-1)[0] for p in pieces).decode() == expected


def _final(result: Any) -> bool:
    if isinstance(result, Exception):
        return True
    return result.get_response().parameters["triton_final_response"].bool_param


def test_logits_tensors_through_the_generate_extension(server):
    status, raw = post(server, f"/v2/models/{MODEL}/generate",
                       {"text_input": "Hello there", "max_tokens": 3, "ignore_eos": True,
                        "return_context_logits": True, "return_generation_logits": True})
    assert status == 200, raw
    doc = json.loads(raw)
    prompt, generated = doc["prompt_tokens"], doc["completion_tokens"]
    context, generation = doc["context_logits"], doc["generation_logits"]
    vocab = len(context) // prompt
    assert prompt > 1 and generated == 3 and vocab > 1
    assert len(context) == prompt * vocab  # a row per prompt token, none lost to prefix reuse
    assert len(generation) == generated * vocab


# --- issue 15, finding 6 ----------------------------------------------------------------------------
def test_a_tiny_temperature_does_not_kill_the_manager(server):
    status, raw = post(server, f"/v2/models/{MODEL}/generate",
                       {"text_input": "Hello", "max_tokens": 4, "temperature": 1e-38, "runtime_top_k": 40})
    assert status == 200, raw
    status, raw = post(server, f"/v2/models/{MODEL}/generate", {"text_input": "Hello", "max_tokens": 3})
    assert status == 200
    assert urllib.request.urlopen(f"{server.http_url}/v2/models/{MODEL}/ready").status == 200


@pytest.mark.parametrize("name, value", [("temperature", math.nan), ("temperature", math.inf),
                                         ("stop", "[bad"), ("runtime_top_k", -1),
                                         ("max_tokens", "many")])
def test_bad_parameters_over_http_generate_are_400_naming_them(server, name, value):
    status, raw = post(server, f"/v2/models/{MODEL}/generate",
                       {"text_input": "Hello", "max_tokens": 2, name: value})
    assert status == 400, raw
    assert name.replace("runtime_", "") in str(raw), raw
    status, raw = post(server, f"/v2/models/{MODEL}/generate", {"text_input": "Hi", "max_tokens": 2})
    assert status == 200, raw


@pytest.mark.parametrize("name, value", [("temperature", math.nan), ("temperature", -1.0),
                                         ("runtime_top_p", 2.0), ("runtime_top_k", -5),
                                         ("repetition_penalty", 0.0), ("max_tokens", 0),
                                         ("random_seed", None), ("beam_width", 9)])
def test_bad_parameters_over_grpc_are_400_naming_them(server, name, value):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        got: list[Any] = []
        c.start_stream(callback=lambda result, error: got.append(error or result))
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"Hello"]], dtype=object))
        inputs = [text]
        params: dict[str, Any] = {"max_tokens": 4}
        if name == "random_seed":  # a string where a number belongs, as a request parameter
            params["random_seed"] = "seven"
        elif name in ("temperature", "runtime_top_p", "repetition_penalty"):
            t = grpcclient.InferInput(name, [1, 1], "FP32")
            t.set_data_from_numpy(np.array([[value]], np.float32))
            inputs.append(t)
        else:
            params[name] = value
        c.async_stream_infer(MODEL, inputs, parameters=params)
        assert wait_until(lambda: bool(got), timeout=30)
        c.stop_stream()
    error = got[0]
    assert isinstance(error, Exception), error
    message = str(error)
    assert name.replace("runtime_", "") in message or name in message, message
    status, _ = post(server, f"/v2/models/{MODEL}/generate", {"text_input": "Hi", "max_tokens": 2})
    assert status == 200


def test_a_dropped_generate_request_is_cancelled_and_frees_its_blocks(server):
    before = metric(server, "vllm:request_success_total", 'finished_reason="abort"')
    body = json.dumps({"text_input": "Hello", "max_tokens": 2000, "ignore_eos": True}).encode()
    host, port = server.url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v2/models/%s/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (MODEL.encode(), len(body), body))
    assert wait_until(lambda: metric(server, "vllm:num_requests_running") > 0, timeout=30)
    sock.close()
    assert wait_until(lambda: metric(server, "vllm:num_requests_running") == 0, timeout=30)
    assert metric(server, "vllm:request_success_total", 'finished_reason="abort"') == before + 1
    assert metric(server, "nv_trt_llm_kv_cache_block_metrics", 'kv_cache_block_type="used"') == 0
    assert metric(server, "vllm:generation_tokens_total") < 2000 * 2  # it did not run to the end


def test_serving_metrics_use_vllm_names(server, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds_count",
                 "vllm:request_queue_time_seconds_sum", "vllm:e2e_request_latency_seconds_count",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):
        assert re.search(rf"^{re.escape(name)}\{{.*model_name=\"{MODEL}\"", text, re.M), name
    assert metric(server, "vllm:e2e_request_latency_seconds_count") >= 1
