"""Request shapes real clients send, fields never silently ignored, per-request bounds, a bounded queue."""
import asyncio
import dataclasses
import json

import httpx
import pytest
from openai import BadRequestError
from test_serve import LiveServer, complete

from specmesh.lossless.sampling import SamplingParams
from specmesh.serve.protocol import (LOOKED_OVER_ABOVE, APIError, ChatRequest, CompletionRequest, Limits,
                                     refuse_wide_fields, sampling_params)


@pytest.fixture(scope="module")
def live(tiny_checkpoint):
    server = LiveServer(tiny_checkpoint, max_batch=4)
    yield server
    server.close()


def post(live, body, path="/v1/completions"):
    """The body as JSON with non-ASCII escaped, as most clients send it (a lone surrogate goes as "\\ud800")."""
    return httpx.post(live.url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=30)


def test_prompts_as_strings_token_ids_and_lists_of_either(live):
    tok = live.server.engine.tokenizer
    text = [complete(live, p, max_tokens=6, temperature=0).choices[0].text for p in ("def add(a, b):", "import os")]
    ids = [tok.encode("def add(a, b):"), tok.encode("import os")]
    assert complete(live, ids[0], max_tokens=6, temperature=0).choices[0].text == text[0]       # token ids
    many = complete(live, ids, max_tokens=6, temperature=0)                                    # a list of id lists
    assert [c.text for c in many.choices] == text and many.usage.prompt_tokens == sum(map(len, ids))
    assert [c.text for c in complete(live, ["def add(a, b):", "import os"], max_tokens=6,
                                     temperature=0).choices] == text


def test_chat_content_as_text_parts_and_roles(live):
    def chat(messages):
        return live.client.chat.completions.create(model="specmesh-target", max_tokens=6, temperature=0,
                                                   messages=messages).choices[0].message.content
    plain = chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}])
    parts = chat([{"role": "developer", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}])
    assert parts == plain                   # developer is a system message; text parts are joined
    for messages, field in [([{"role": "wizard", "content": "x"}], "wizard"),
                            ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                             "image_url"),
                            ([{"role": "tool", "content": "x"}], "tool")]:
        r = post(live, {"messages": messages}, "/v1/chat/completions")
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("field, value", [("logprobs", 50), ("frequency_penalty", 2.5), ("presence_penalty", "1"),
                                          ("repetition_penalty", 0), ("logit_bias", {"5": 101}),
                                          ("logit_bias", {"x": 1}), ("logit_bias", {"100000": 1}),
                                          ("best_of", 3), ("echo", True), ("made_up_field", 1)])
def test_fields_the_server_does_not_support_are_refused_by_name(live, field, value):
    r = post(live, {"prompt": "x", "max_tokens": 2, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert complete(live, "x", max_tokens=2).usage.completion_tokens >= 1          # and the server carries on


def test_fields_with_the_value_that_changes_nothing_are_accepted(live):
    r = post(live, {"prompt": "x", "max_tokens": 2, "frequency_penalty": 0, "presence_penalty": 0.0,
                    "logit_bias": {}, "best_of": 1, "echo": False, "user": "someone"})
    assert r.status_code == 200, r.text


def test_penalties_and_logit_bias_through_the_openai_client(live, tiny_checkpoint):
    """The served output equals `ar` with the same penalties, computed outside the server."""
    from specmesh import LLM
    tok = live.server.engine.tokenizer
    banned = tok.encode(complete(live, "def add(a, b):", max_tokens=1, temperature=0).choices[0].text)[0]
    asked = dict(frequency_penalty=1.0, presence_penalty=0.5, extra_body={"repetition_penalty": 1.3},
                 logit_bias={str(banned): -100})
    got = complete(live, "def add(a, b):", max_tokens=12, temperature=0, **asked).choices[0].text
    want = LLM(target=tiny_checkpoint).generate("def add(a, b):", SamplingParams(
        max_new_tokens=12, frequency_penalty=1.0, presence_penalty=0.5, repetition_penalty=1.3,
        logit_bias={banned: -100}))
    assert got == want.text and want.tokens[0] != banned


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "n": 5}, "n"),                                                     # over max_n (the 4 rows)
    ({"prompt": ["x"] * 17}, "prompt"),                                                 # over max_prompts
    ({"prompt": ["x"] * 4, "n": 4, "max_tokens": 200}, "max_tokens"),                   # 3200 new tokens > 8 x 256
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stop": "s" * 300}, "stop"),
    ({"prompt": [[1, 2], [100000]]}, "prompt"),                                         # an id past the vocabulary
    ({"prompt": []}, "prompt"), ({"prompt": [True, 1]}, "prompt"),
])
def test_every_bound_is_a_400_naming_the_field(live, body, param):
    r = post(live, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert complete(live, "x", max_tokens=2).usage.completion_tokens >= 1


def test_the_openai_client_sees_bounds_as_bad_requests(live):
    with pytest.raises(BadRequestError):
        complete(live, "x", n=100000)


def test_a_full_queue_answers_429_with_retry_after(live):
    limits = live.server.limits
    live.server.limits = dataclasses.replace(limits, max_queued=0)
    try:
        r = post(live, {"prompt": "x", "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"
    finally:
        live.server.limits = limits
    assert post(live, {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_the_queue_bound_counts_the_sequences_waiting(tiny_checkpoint):
    from specmesh.serve import ServeConfig, build
    server, _ = build(ServeConfig(target=str(tiny_checkpoint), dtype="float32", max_batch=2, max_queued=4))
    ids = [server.engine.tokenizer.encode("def")]

    async def submit(n):                   # the engine is not running: what is submitted waits
        return server.start(ids, SamplingParams(max_new_tokens=2, n=n))

    asyncio.run(submit(3))
    with pytest.raises(APIError) as refused:
        asyncio.run(submit(2))
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
    assert server.engine.scheduler.waiting == 3


def test_a_chat_answer_may_run_to_the_context_and_a_completion_to_16_tokens():
    chat, limits = (lambda **more: ChatRequest.of({"messages": [{"role": "user", "content": "hi"}]} | more),
                    Limits(max_tokens_total=8192))
    assert sampling_params(chat(), 10, 1, 1024, limits).max_new_tokens == 1014       # what the context leaves
    assert sampling_params(chat(n=16), 10, 1, 1024, limits).max_new_tokens == 512   # within the bound
    assert sampling_params(chat(max_tokens=7), 10, 1, 1024, limits).max_new_tokens == 7
    assert sampling_params(CompletionRequest.of({"prompt": "x"}), 10, 1, 1024, limits).max_new_tokens == 16
    with pytest.raises(APIError, match="context"):
        sampling_params(chat(), 1024, 1, 1024, limits)


def test_limits_scale_with_the_engine():
    limits = Limits.for_engine(rows=8, context=1024)
    assert (limits.max_n, limits.max_sequences, limits.max_queued) == (8, 32, 128)


def test_logprobs_in_the_openai_shapes_equal_to_the_target_computed_directly(live, tiny_checkpoint):
    import torch

    from specmesh import LLM
    out = complete(live, "def add(a, b):", max_tokens=8, temperature=0, logprobs=2).choices[0]
    lp = out.logprobs
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset) >= 1
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # greedy: no alternative beats the chosen token (tokens with the same text share one key of the dict)
    assert all(1 <= len(top) <= 2 and max(top.values()) <= v + 1e-6 for top, v in zip(lp.top_logprobs,
                                                                                       lp.token_logprobs))
    llm = LLM(target=tiny_checkpoint)                                   # a plain forward, no cache, no kernels
    prompt = llm.encode("def add(a, b):")
    tokens = llm.generate(prompt, SamplingParams(max_new_tokens=8)).tokens
    with torch.inference_mode():
        logits = llm.models.target.forward(torch.tensor([prompt + tokens]))[0, len(prompt) - 1:-1]
    direct = logits.log_softmax(-1)[range(len(tokens)), tokens].tolist()
    assert lp.token_logprobs == pytest.approx(direct, abs=1e-4)
    chat = live.client.chat.completions.create(model="specmesh-target", max_tokens=5, temperature=0, logprobs=True,
                                               top_logprobs=3, messages=[{"role": "user", "content": "hi"}])
    content = chat.choices[0].logprobs.content
    assert bytes(b for c in content for b in c.bytes).decode("utf-8", "replace") == chat.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob == c.logprob for c in content)
    streamed = [c.choices[0].logprobs for c in complete(live, "def add(a, b):", max_tokens=8, temperature=0,
                                                        logprobs=2, stream=True) if c.choices]
    assert [v for part in streamed if part for v in part.token_logprobs] == lp.token_logprobs


def test_top_logprobs_without_logprobs_is_refused(live):
    r = post(live, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "/v1/chat/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),        # without stream
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": "x"}}, "stream_options"),
    ({"prompt": "x", "user": 5}, "user"),
    ({"prompt": "x", "logit_bias": [1]}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"prompt": "a\ud800b"}, "prompt"),                                     # JSON's escape of a lone surrogate
    ({"messages": [{"role": "user", "content": "\udfff"}]}, "messages"),
])
def test_wrongly_typed_fields_are_400s_naming_them(live, body, param):
    r = post(live, body, "/v1/chat/completions" if "messages" in body else "/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert param in r.json()["error"]["message"]


def test_bodies_too_large_or_too_deep_are_refused(live):
    deep = httpx.post(live.url + "/v1/completions", content=b"[" * 100_000 + b"]" * 100_000, timeout=30)
    big = httpx.post(live.url + "/v1/completions", content=b" " * (5 * 2 ** 20), timeout=30)
    assert deep.status_code == 400 and "nested" in deep.json()["error"]["message"]
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    assert complete(live, "x", max_tokens=2).usage.completion_tokens >= 1


def test_a_stream_reports_the_logprobs_of_the_tokens_its_events_speak_for():
    """The engine thread appends tokens and logprobs while an event waits for the event loop: a chunk reports the
    logprobs up to its events' token count, and the next chunk the rest (none lost, none twice). Before, it took
    the list's length after building the chunk, dropping the entries appended meanwhile."""
    from types import SimpleNamespace
    from specmesh.engine.sequence import Event
    from specmesh.serve.api import Choices, completion_logprobs, stream

    seq = SimpleNamespace(params=SamplingParams(logprobs=0), tokens=[5, 6], logprobs=[(-0.5, []), (-0.25, [])])
    server = SimpleNamespace(tokenizer=SimpleNamespace(token_bytes=[b"t%d" % t for t in range(10)]),
                             abort_unfinished=lambda choices, done: None)
    choices = Choices(asyncio.Queue(), [seq])
    chunk = lambda i, text, reason, start, end: {"text": text, "finish_reason": reason,
                                                 "logprobs": completion_logprobs(server, choices, i, start, end)}

    async def run():
        choices.events.put_nowait((0, Event("t5t6", tokens=2)))
        seq.tokens.append(7)                                 # the engine ran on before the loop woke
        seq.logprobs.append((-0.125, []))
        body = stream(None, server, choices, {}, False, chunk).body_iterator
        first = await body.__anext__()
        choices.events.put_nowait((0, Event("t7", "length", tokens=3)))
        return first, [part async for part in body]

    first, rest = asyncio.run(run())
    assert '"token_logprobs": [-0.5, -0.25]' in first and '"text_offset": [0, 2]' in first
    assert '"token_logprobs": [-0.125]' in rest[0] and '"text_offset": [4]' in rest[0]


def test_a_temperature_too_small_to_divide_by_decodes_greedily(live):
    """Below 1e-5 a temperature samples the argmax but at exact ties, and dividing the logits by it overflows
    them (1e-300 is 0 in float32): it decodes greedily, and the server carries on."""
    assert SamplingParams(temperature=1e-300).greedy and SamplingParams(temperature=1e-6).greedy
    assert not SamplingParams(temperature=1e-4).greedy
    greedy = complete(live, "def add(a, b):", max_tokens=8, temperature=0).choices[0].text
    assert complete(live, "def add(a, b):", max_tokens=8, temperature=1e-300).choices[0].text == greedy
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize("body, message", [
    ({"prompt": "x", "seed": 2 ** 64}, "seed must be an integer in [-2**63, 2**63), got 18446744073709551616"),
    ({"prompt": "x", "stop": ""}, "stop must be a non-empty string or a list of them, got ['']"),
    ({"prompt": "x", "logit_bias": {"5": 1e9}}, "logit_bias[5] must be a number in [-100, 100], got 1000000000.0"),
    ({"prompt": "x", "logit_bias": {"5": "high"}}, "logit_bias[5] must be a number in [-100, 100], got 'high'"),
    ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias keys must be token ids (digits), got 'a'"),
    ({"prompt": "x", "logit_bias": {str(i): 1 for i in range(301)}},
     "logit_bias must map at most 300 token ids, got 301"),
])
def test_the_400_says_what_is_wrong_with_the_value(live, body, message):
    r = post(live, body)
    assert r.status_code == 400 and r.json()["error"]["message"] == message, r.text


def test_unknown_paths_and_methods_and_big_bodies_answer_in_openai_shape(live):
    for r, status in ((httpx.get(live.url + "/v1/nothing"), 404), (httpx.get(live.url + "/v1/completions"), 405),
                      (httpx.post(live.url + "/v1/completions", content=b" " * (5 * 2 ** 20), timeout=30), 413)):
        assert r.status_code == status and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert "GET /v1/nothing" in httpx.get(live.url + "/v1/nothing").json()["error"]["message"]


def test_a_prompt_whose_bytes_exceed_the_context_is_refused_before_it_is_tokenized(live):
    """Each token stands for at most max_token_bytes bytes: a text with more than context x that many bytes cannot
    fit, and is refused without the second that tokenizing a megabyte takes."""
    tokenizer = live.server.engine.tokenizer
    size = live.server.engine.context * tokenizer.max_token_bytes
    r = post(live, {"prompt": "a" * size})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert f"({size} bytes)" in r.json()["error"]["message"]
    over = post(live, {"prompt": "x", "max_tokens": live.server.engine.context})
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"


def test_a_big_bodys_field_wider_than_any_valid_request_is_refused_before_it_is_built():
    """refuse_wide_fields reads a body lazily (simdjson): logit_bias past its bound, an array longer than the
    context. What simdjson cannot read (an integer past 64 bits) is left to json.loads, which names it."""
    with pytest.raises(APIError, match="at most 300 token ids, got 150000") as e:
        refuse_wide_fields(json.dumps({"prompt": "x", "logit_bias": {str(i): 1 for i in range(150_000)}}).encode(), 256)
    assert e.value.param == "logit_bias"
    with pytest.raises(APIError, match="prompt holds 257 values") as e:
        refuse_wide_fields(json.dumps({"prompt": [1] * 257}).encode(), 256)
    assert e.value.param == "prompt"
    for fine in ({"prompt": [1] * 256, "logit_bias": {"1": 1}}, {"prompt": "x", "seed": 2 ** 64}, ["x"] * 1000):
        refuse_wide_fields(json.dumps(fine).encode(), 256)


def test_a_big_body_is_looked_over_first_and_answered_as_any_other(live):
    pad = " " * LOOKED_OVER_ABOVE
    wide = post(live, {"prompt": list(range(live.server.engine.context + 1)), "x": pad})
    assert wide.status_code == 400 and wide.json()["error"]["param"] == "prompt" and "holds" in wide.text, wide.text
    seed = post(live, {"prompt": "x", "seed": 2 ** 64, "user": pad})
    assert seed.status_code == 400 and seed.json()["error"]["param"] == "seed", seed.text
    ok = post(live, {"prompt": "def", "max_tokens": 2, "user": pad})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text
