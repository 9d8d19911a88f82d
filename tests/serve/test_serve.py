"""`specmesh serve`: a real server on 127.0.0.1 driven by the official openai client."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from openai import BadRequestError, NotFoundError, OpenAI

from conftest import free_port, start_server_process
from specmesh.serve import ServeConfig, build

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x = ", "self.y = y\n\n",
           "import os\n", "print(", "return self", "if x:\n    ", "while True:", "try:\n", "with open(",
           "lambda x:", "a = [", "def f():\n    return", "# comment\n"]


class LiveServer:
    def __init__(self, checkpoint, **kw):
        self.port = free_port()
        cfg = ServeConfig(target=str(checkpoint), dtype="float32", port=self.port, log_level="warning",
                          model_name="specmesh-target", **kw)
        self.server, app = build(cfg)
        self.server.engine.start()
        self.web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.web.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.web.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def close(self):
        self.web.should_exit = True
        self.thread.join(timeout=10)
        self.server.engine.stop()
        self.server.llm.close()                 # a multi-process method's processes end here


@pytest.fixture(scope="module")
def live(tiny_checkpoint):
    server = LiveServer(tiny_checkpoint)
    yield server
    server.close()


def complete(live, prompt, **kw):
    return live.client.completions.create(model="specmesh-target", prompt=prompt, **kw)


def test_completion_chat_models_and_health(live):
    out = complete(live, "def add(a, b):", max_tokens=12, temperature=0)
    assert out.choices[0].finish_reason in ("length", "stop") and out.usage.completion_tokens <= 12
    assert out.usage.prompt_tokens == len(live.server.engine.tokenizer.encode("def add(a, b):"))
    chat = live.client.chat.completions.create(model="specmesh-target", max_tokens=5, temperature=0,
                                               messages=[{"role": "user", "content": "hello"}])
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 5
    assert [m.id for m in live.client.models.list()] == ["specmesh-target"]
    assert live.client.models.retrieve("specmesh-target").id == "specmesh-target"
    missing = httpx.get(live.url + "/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert httpx.get(live.url + "/health").status_code == 200


def test_default_max_tokens_is_16(live):
    out = complete(live, "x", temperature=0.0)
    assert out.usage.completion_tokens <= 16


def test_streaming_gives_the_same_text_and_ends_with_done(live):
    whole = complete(live, "class Point:\n    def", max_tokens=20, temperature=0).choices[0].text
    pieces = [c.choices[0].text for c in complete(live, "class Point:\n    def", max_tokens=20, temperature=0,
                                                   stream=True)]
    assert "".join(pieces) == whole
    raw = httpx.post(live.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True}).text
    assert raw.rstrip().endswith("data: [DONE]")
    chunks = list(live.client.chat.completions.create(model="specmesh-target", max_tokens=4, stream=True,
                                                      messages=[{"role": "user", "content": "hi"}],
                                                      stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 4 or chunks[-1].usage.completion_tokens < 4


def test_n_seed_and_stop(live):
    a = complete(live, "def", max_tokens=10, temperature=1.0, n=3, seed=7)
    b = complete(live, "def", max_tokens=10, temperature=1.0, n=3, seed=7)
    c = complete(live, "def", max_tokens=10, temperature=1.0, n=3, seed=8)
    assert [x.text for x in a.choices] == [x.text for x in b.choices] != [x.text for x in c.choices]
    assert [x.index for x in a.choices] == [0, 1, 2]
    assert a.usage.completion_tokens == sum(len(live.server.engine.tokenizer.encode(x.text)) for x in a.choices) \
        or a.usage.completion_tokens >= 3
    full = complete(live, "for i in range(10):\n", max_tokens=30, temperature=0).choices[0].text
    stop = full[5:8]
    cut = complete(live, "for i in range(10):\n", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"


BAD = [({"prompt": ""}, "prompt"), ({"prompt": "x" * 3000}, "prompt"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
       ({"prompt": "x", "max_tokens": -3}, "max_tokens"), ({"prompt": "x", "max_tokens": 100000}, "max_tokens"),
       ({"prompt": "x", "temperature": -1}, "temperature"), ({"prompt": "x", "top_p": 0}, "top_p"),
       ({"prompt": "x", "top_p": 1.5}, "top_p"), ({"prompt": "x", "n": 0}, "n"),
       ({"prompt": "x", "model": "gpt-4"}, "model")]            # 404, as OpenAI's


@pytest.mark.parametrize("body, param", BAD)
def test_bad_requests_get_4xx_and_the_server_stays_healthy(live, body, param):
    r = httpx.post(live.url + "/v1/completions", json=body)
    assert r.status_code == (404 if param == "model" else 400), r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert complete(live, "x", max_tokens=2).usage.completion_tokens >= 1


@pytest.mark.parametrize("content", [b'{"prompt": "x", "temperature": NaN}', b"{not json", b'\xff\xfe{"prompt": 1}',
                                     b'["a list"]'])
def test_malformed_bodies_get_400(live, content):
    r = httpx.post(live.url + "/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_openai_client_sees_a_bad_request_error(live):
    with pytest.raises(BadRequestError):
        complete(live, "x", max_tokens=0)
    with pytest.raises(NotFoundError):
        live.client.completions.create(model="gpt-4", prompt="x", max_tokens=2)


def test_concurrent_greedy_clients_get_what_they_get_alone(live):
    alone = [complete(live, p, max_tokens=24, temperature=0).choices[0].text for p in PROMPTS]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: complete(live, p, max_tokens=24, temperature=0).choices[0].text, PROMPTS))
    assert together == alone


def test_a_client_that_disconnects_is_aborted_and_its_row_freed(live):
    engine = live.server.engine
    with httpx.stream("POST", live.url + "/v1/completions",
                      json={"prompt": "def", "max_tokens": 200, "stream": True, "temperature": 0}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break
    deadline = time.monotonic() + 5
    while not engine.idle:
        assert time.monotonic() < deadline, "the disconnected request is still running"
        time.sleep(0.01)
    assert 'reason="aborted"' in httpx.get(live.url + "/metrics").text


def test_a_client_that_gives_up_on_a_plain_request_frees_its_rows_at_once(live, tiny_checkpoint):
    engine = live.server.engine
    engine.runner.model = Slow(engine.runner.model, 0.01)           # 200 tokens: 2 s at least
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(live.url + "/v1/completions", json={"prompt": "def", "max_tokens": 200, "n": 2}, timeout=0.2)
        left = time.monotonic()
        while not engine.idle:
            assert time.monotonic() < left + 0.3, "the abandoned request is still running"
            time.sleep(0.01)
    finally:
        engine.runner.model = engine.runner.model.model


class Slow:
    """The target, each forward at least `seconds` long."""

    def __init__(self, model, seconds):
        self.model, self.seconds = model, seconds

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kw):
        time.sleep(self.seconds)
        return self.model(*args, **kw)


def metric(live, name) -> float:
    for line in httpx.get(live.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_client_that_leaves_mid_prefill_frees_its_rows(tiny_checkpoint):
    """A long prompt is computed in chunks of 8 tokens, 50 ms each here; the client leaves after the
    first few: the prefill stops within a chunk, no row is held and nothing waits."""
    live = LiveServer(tiny_checkpoint, max_batch=2, prefill_chunk=8)
    runner = live.server.engine.runner
    runner.model = Slow(runner.model, 0.05)
    prompt = "def add(a, b):\n    return a + b\n\n" * 8
    chunks = -(-len(live.server.engine.tokenizer.encode(prompt)) // 8)
    try:
        with httpx.stream("POST", live.url + "/v1/completions",
                          json={"prompt": prompt, "max_tokens": 50, "stream": True, "n": 2}):
            deadline = time.monotonic() + 5
            while metric(live, "specmesh_prefill_pending_tokens") == 0:
                assert time.monotonic() < deadline, "the prefill did not start"
                time.sleep(0.01)
            assert metric(live, "specmesh_queue_length") == 2 and metric(live, "specmesh_running_batch_size") == 0
        deadline = time.monotonic() + 5
        while metric(live, "specmesh_prefill_pending_tokens") or metric(live, "specmesh_queue_length"):
            assert time.monotonic() < deadline, "the prefill went on after its client left"
            time.sleep(0.01)
        assert metric(live, "specmesh_running_batch_size") == 0 and live.server.engine.idle
        assert live.server.engine.stats.target_forwards < chunks / 2
        assert complete(live, "x", max_tokens=3).usage.completion_tokens >= 1       # the server carries on
    finally:
        live.close()


def test_metrics_move(live):
    def value(name):
        for line in httpx.get(live.url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")
    before = value("specmesh_generated_tokens_total"), value("specmesh_requests_total")
    complete(live, "x", max_tokens=5, temperature=0)
    after = value("specmesh_generated_tokens_total"), value("specmesh_requests_total")
    assert after[0] >= before[0] + 1 and after[1] == before[1] + 1
    assert value("specmesh_time_to_first_token_seconds_count") >= 1


class FailsWhenBatched:
    """The target, except that a forward over two or more sequences raises (a simulated kernel fault).
    Each step takes a millisecond at least, so the first request still runs when the second comes."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, x, *args, **kw):
        if x.shape[0] >= 2:
            raise RuntimeError("simulated kernel fault")
        time.sleep(0.001)
        return self.model(x, *args, **kw)


def test_an_engine_failure_fails_requests_in_flight_and_health(tiny_checkpoint):
    server = LiveServer(tiny_checkpoint)
    try:
        engine = server.server.engine
        engine.runner.model = FailsWhenBatched(engine.runner.model)
        body = {"prompt": "x", "max_tokens": 200, "temperature": 0}
        with ThreadPoolExecutor(2) as pool:
            plain = pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=20)
            time.sleep(0.05)
            streamed = pool.submit(httpx.post, server.url + "/v1/completions", json=body | {"stream": True},
                                   timeout=20)
            plain, streamed = plain.result(), streamed.result()
        assert plain.status_code == 500 and "simulated kernel fault" in plain.json()["error"]["message"]
        events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and "simulated kernel fault" in json.loads(events[-2])["error"]["message"]
        assert httpx.get(server.url + "/health").status_code == 503
        assert httpx.post(server.url + "/v1/completions", json={"prompt": "x"}).status_code == 503
    finally:
        server.close()


@pytest.mark.parametrize("mode", [{"concurrency": 3}, {"rate": 20.0}])
def test_loadtest_reports_throughput_and_latency_percentiles(live, tmp_path, mode):
    from specmesh.cli import main
    out, prompts, chats = tmp_path / "load.json", tmp_path / "prompts.jsonl", tmp_path / "chats.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    chats.write_text("".join(json.dumps({"turns": [p]}) + "\n" for p in PROMPTS))     # through /v1/chat/completions
    flag, value = next(iter(mode.items()))
    assert main(["loadtest", "--url", live.url, f"--{flag}", str(value), "--duration", "1.5", "--max-tokens", "8",
                 "--prompts", str(prompts), "--prompts", str(chats), "--method", "auto", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert set(summary) == {"requests", "errors", "throughput_tok_s", "ttft_ms", "tpot_ms", "latency_ms"}
    assert summary["requests"] >= 3 and summary["errors"] == 0 and summary["throughput_tok_s"] > 0
    for key in ("ttft_ms", "tpot_ms", "latency_ms"):
        p = summary[key]
        assert set(p) == {"p50", "p90", "p99"} and 0 < p["p50"] <= p["p90"] <= p["p99"]


def test_loadtest_sends_a_prompt_files_chat_turns_as_messages(tmp_path):
    from specmesh.bench.prompts import load_prompts
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"prompt": "def f():"}) + "\n" + json.dumps({"turns": ["Hi there", "later"]}) + "\n")
    assert load_prompts(mixed, messages=True) == ["def f():", [{"role": "user", "content": "Hi there"}]]
    assert load_prompts(mixed) == ["def f():", "Hi there"]          # no tokenizer: the turn's text as it is


def test_loadtest_counts_errors_and_fails_when_none_got_through(live):
    from specmesh.bench.loadtest import LoadConfig, run
    from specmesh.cli import main
    summary, errors = run(LoadConfig(url=live.url, concurrency=1, duration=0.3, prompts=["x"], model="nope"))
    assert summary["requests"] >= 1 and summary["errors"] == summary["requests"] and "nope" in errors[0]
    assert main(["loadtest", "--url", live.url, "--concurrency", "1", "--duration", "0.3", "--model", "nope"]) == 1


def test_loadtest_against_no_server_fails_at_once():
    from specmesh.bench.loadtest import LoadConfig, run
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"no server answers at http://127.0.0.1:\d+/health"):
        run(LoadConfig(url=f"http://127.0.0.1:{free_port()}", concurrency=1, duration=30, prompts=["x"]))
    assert time.monotonic() - start < 10                # not the 30 s of errors it had reported


def test_sigterm_drains_running_requests_and_refuses_new_ones():
    import os
    import signal
    proc, url = start_server_process("--grace", "20")
    try:
        body = {"prompt": "x", "max_tokens": 300, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.1)
            refused = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
            rest = list(lines)
        assert refused.status_code == 503
        assert [x for x in rest if x][-1] == "data: [DONE]"
        assert not any("error" in x for x in rest)              # drained: it finished
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_a_port_in_use_fails_the_server_with_exit_status_1():
    import socket
    import subprocess
    import sys
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = subprocess.run([sys.executable, "-m", "specmesh.cli", "serve", "--method", "ar", "--port",
                              str(taken.getsockname()[1])], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "could not serve on 127.0.0.1" in out.stderr     # uvicorn's error had exited 0


@pytest.mark.parametrize("how", ["second-sigterm", "deadline"])
def test_a_second_sigterm_or_the_drain_deadline_cancels_what_is_left(how):
    import os
    import signal
    from concurrent.futures import ThreadPoolExecutor
    proc, url = start_server_process("--grace", "30" if how == "second-sigterm" else "1")
    try:
        body = {"prompt": "x", "max_tokens": 1000, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r, ThreadPoolExecutor() as pool:
            whole = pool.submit(httpx.post, url + "/v1/completions", json=body | {"stream": False}, timeout=30)
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            if how == "second-sigterm":
                time.sleep(0.2)
                proc.send_signal(signal.SIGTERM)
            rest = [x for x in lines if x]
            refused = whole.result()
        assert rest[-1] == "data: [DONE]" and "shut down before this request finished" in rest[-2]
        assert '"server_shutting_down"' in rest[-2]                 # not the engine's failure
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
        assert proc.wait(timeout=15) == 0 and time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def solo_outputs(checkpoint, method, draft, prompts, max_tokens):
    """What `LLM.generate` (the path of `specmesh generate`) gives each prompt alone, float32 as the servers here."""
    from specmesh import LLM, SamplingParams
    llm = LLM(target=checkpoint, draft=draft, method=method, dtype="float32")
    return [llm.generate(p, SamplingParams(max_new_tokens=max_tokens)).text for p in prompts]


@pytest.mark.parametrize("method, draft", [("sd", "tiny_checkpoint"), ("sd", "tiny_draft_checkpoint"),
                                           ("tree", "tiny_checkpoint"), ("tree", "tiny_draft_checkpoint"),
                                           ("selfdraft", None)])          # perfect and random drafts
def test_speculative_server_gives_ar_output_alone_and_batched(live, tiny_checkpoint, request, draft, method):
    draft = draft and request.getfixturevalue(draft)
    sd = LiveServer(tiny_checkpoint, method=method, draft=draft and str(draft))
    try:
        expected = [complete(live, p, max_tokens=30, temperature=0).choices[0].text for p in PROMPTS]
        alone = [complete(sd, p, max_tokens=30, temperature=0).choices[0].text for p in PROMPTS[:4]]
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda p: complete(sd, p, max_tokens=30, temperature=0).choices[0].text,
                                     PROMPTS))
        assert alone == expected[:4] and together == expected
        assert together == solo_outputs(tiny_checkpoint, method, draft, PROMPTS, 30)
        stats = sd.server.engine.stats
        perfect = draft == tiny_checkpoint
        if method == "sd":
            assert stats.drafted_tokens > 0 and (stats.accepted_tokens == stats.drafted_tokens if perfect
                                                 else stats.accepted_tokens < stats.drafted_tokens / 5)
        elif method == "tree":                  # a tree accepts one path of its nodes at most
            assert stats.target_forwards < (30 * len(PROMPTS)) / 2 if perfect \
                else stats.accepted_tokens < stats.drafted_tokens / 5
        else:
            assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
        seeded = [complete(sd, "def", max_tokens=12, temperature=1.0, seed=3).choices[0].text for _ in range(2)]
        assert seeded[0] == seeded[1]
    finally:
        sd.close()


def test_the_server_answers_as_specmesh_generate_does(live, tiny_checkpoint, tmp_path):
    from specmesh.cli import main
    for prompt in PROMPTS[:2]:
        out = tmp_path / "out.json"
        assert main(["generate", prompt, "--target", str(tiny_checkpoint), "--dtype", "float32", "--max-new-tokens",
                     "24", "--json", str(out)]) == 0
        served = complete(live, prompt, max_tokens=24, temperature=0).choices[0].text
        assert json.loads(out.read_text())["text"] == served


def test_the_server_refuses_an_unknown_method(tiny_checkpoint):
    with pytest.raises(ValueError, match="unknown method 'medusa': one of auto, ar, sd, .*, pipedec, stpp"):
        build(ServeConfig(target=str(tiny_checkpoint), method="medusa"))


def test_the_batch_is_bounded_by_the_kv_cache_memory():
    """engine/sizing.py, for LLM and the server alike: rows of a full context within the bound; a long-context
    model's row cut to what fits; asked-for sizes past the bound refused."""
    from types import SimpleNamespace

    import torch

    from specmesh.engine.sizing import size
    config = SimpleNamespace(num_layers=4, num_kv_heads=2, head_dim=64, max_position_embeddings=8191)
    models = SimpleNamespace(target=SimpleNamespace(config=config, cache_dtype=torch.float32), draft=None)
    # a token: 4 layers x 2 (k, v) x 2 heads x 64 x 4 bytes = 4 KiB; a row of 8192: 32 MB
    assert size(models, 1, max_kv_mb=400) == (s := size(models, 1, max_kv_mb=400)) and s.rows == 12
    assert size(models, 1, max_kv_mb=1000).rows == 16 and size(models, 1, max_kv_mb=1000).max_len == 8192
    assert size(models, 1, max_batch=20, max_kv_mb=1000).rows == 20
    cut = size(models, 1, max_kv_mb=8)                          # not one full row: the row holds what fits
    assert cut.rows == 1 and cut.context == 2047 and cut.max_len == 2048
    assert size(models, 1, max_len=1000, max_kv_mb=1000).context == 1000
    for asked in (dict(max_batch=20, max_kv_mb=400), dict(max_len=8000, max_kv_mb=8)):
        with pytest.raises(ValueError, match="max-kv-mb"):
            size(models, 1, **asked)


def test_cosine_server_with_a_drafter_process_killed_mid_run(live, tiny_checkpoint, tiny_draft_checkpoint,
                                                              tiny_draft_copy):
    """`specmesh serve --method cosine --drafter-processes`: concurrent clients get ar's text before and after a
    drafter process is killed mid-run (it is routed no more); /metrics says what each drafter did."""
    import os
    import signal
    drafters = f"{tiny_checkpoint},{tiny_draft_checkpoint},{tiny_draft_copy}"
    cos = LiveServer(tiny_checkpoint, method="cosine",
                     options={"drafters": drafters, "drafter_processes": True, "timeout": 5})
    try:
        expected = [complete(live, p, max_tokens=30, temperature=0).choices[0].text for p in PROMPTS]
        ask = lambda p: complete(cos, p, max_tokens=30, temperature=0).choices[0].text
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(ask, PROMPTS)) == expected
            later = pool.map(ask, PROMPTS)
            os.kill(cos.server.llm.models.remote.link.pids[1], signal.SIGKILL)
            assert list(later) == expected
        assert list(map(ask, PROMPTS[:4])) == expected[:4]
        assert metric(cos, f'specmesh_drafter_rounds_total{{drafter="{tiny_checkpoint.name}"}}') > 0
        assert metric(cos, f'specmesh_drafter_alive{{drafter="{tiny_checkpoint.name}"}}') == 0      # the killed one
        assert metric(cos, f'specmesh_drafter_alive{{drafter="{tiny_draft_checkpoint.name}"}}') == 1
        assert httpx.get(cos.url + "/health").status_code == 200
    finally:
        cos.close()
