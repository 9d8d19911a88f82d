"""The OpenAI-compatible HTTP API over the engine (FastAPI).

POST /v1/completions, POST /v1/chat/completions (streaming: server-sent events ending
with `data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus).
Bad requests get 400 with OpenAI's error body, never 500; an engine failure fails the
requests in flight (500, or an error event then [DONE] when streaming) and turns
/health to 503. While draining (after SIGTERM) new requests get 503.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specmesh.engine.engine import Engine, deliver_here
from specmesh.engine.sequence import Sequence
from specmesh.serve.metrics import Metrics
from specmesh.spec.sampling import InvalidParameter, SamplingParams

PLAIN_CHAT_TEMPLATE = "{role}: {content}\n"     # one line per message, then "assistant:"
OPENAI_DEFAULTS = {"max_new_tokens": 16, "temperature": 1.0}


class APIError(Exception):
    """An error answered in OpenAI's shape: 400 for bad input, 503 while draining, 500 on failure."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class Choices:
    """The choices of one HTTP request: its sequences (its prompts times n, in choice order) and their
    events, as (choice index, Event) in the order the engine produced them."""
    events: asyncio.Queue
    seqs: list[Sequence]


class Server:
    """State shared by the routes: the engine, the model name, metrics, draining flag."""

    def __init__(self, engine: Engine, model_name: str, metrics: Metrics):
        self.engine, self.model_name, self.metrics = engine, model_name, metrics
        self.draining = False

    # -- request parsing ----------------------------------------------------------------------
    async def body(self, http: HTTPRequest) -> dict:
        raw = await http.body()
        try:
            body = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise APIError("request body is not valid UTF-8") from None
        except json.JSONDecodeError as e:
            raise APIError(f"request body is not valid JSON: {e.msg} at position {e.pos}") from None
        if not isinstance(body, dict):
            raise APIError("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise APIError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                             "model", "model_not_found")
        return body

    def params(self, body: dict, prompt_tokens: int) -> SamplingParams:
        """OpenAI's fields onto SamplingParams, which checks them (its error becomes a 400 naming the field)."""
        given = {"max_new_tokens": body.get("max_completion_tokens", body.get("max_tokens")),
                 "temperature": body.get("temperature"), "top_p": body.get("top_p"), "top_k": body.get("top_k"),
                 "n": body.get("n"), "seed": body.get("seed"), "stop": body.get("stop") or None}
        try:
            params = SamplingParams(**OPENAI_DEFAULTS | {k: v for k, v in given.items() if v is not None})
        except InvalidParameter as e:
            name = "max_tokens" if e.param == "max_new_tokens" else e.param
            raise APIError(str(e).replace("max_new_tokens", "max_tokens"), name) from None
        if prompt_tokens + params.max_new_tokens > self.engine.context:
            raise APIError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({params.max_new_tokens}) exceeds the "
                           f"context of {self.engine.context} tokens", "max_tokens")
        return params

    def encode(self, text, param: str) -> list[int]:
        if not isinstance(text, str):
            raise APIError(f"{param} must be a string", param)
        if not text:
            raise APIError(f"{param} is empty", param)
        ids = self.engine.tokenizer.encode(text)
        if len(ids) >= self.engine.context:
            raise APIError(f"the prompt has {len(ids)} tokens; the context holds {self.engine.context}", param,
                             "context_length_exceeded")
        return ids

    def chat_prompt(self, messages) -> str:
        if not isinstance(messages, list) or not messages:
            raise APIError("messages must be a non-empty list", "messages")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise APIError("each message needs a string role and string content", "messages")
        template = self.engine.tokenizer.chat_template
        if template:
            import jinja2
            return jinja2.Template(template).render(messages=messages, add_generation_prompt=True)
        return "".join(PLAIN_CHAT_TEMPLATE.format(**m) for m in messages) + "assistant:"

    # -- running requests ---------------------------------------------------------------------
    def start(self, prompts: list[list[int]], params: SamplingParams) -> Choices:
        """Submit params.n sequences per prompt."""
        if self.draining:
            raise APIError("the server is shutting down", code="server_shutting_down", status=503)
        if self.engine.failure is not None:
            raise APIError(f"the engine failed: {self.engine.failure}", code="engine_failed", status=503)
        if self.engine.deliver is deliver_here:             # one wake-up of this loop per engine step
            loop = asyncio.get_running_loop()
            self.engine.deliver = lambda batch: loop.call_soon_threadsafe(deliver_here, batch)
        choices = Choices(asyncio.Queue(), [seq for ids in prompts for seq in self.engine.sequences(ids, params)])
        for i, seq in enumerate(choices.seqs):
            seq.emit = lambda event, i=i: choices.events.put_nowait((i, event))
        self.metrics.requests.inc(len(choices.seqs))
        self.engine.submit(choices.seqs)
        return choices

    def abort_unfinished(self, choices: Choices, reasons: list[str | None]) -> None:
        for seq, reason in zip(choices.seqs, reasons):
            if reason is None:
                self.engine.abort(seq)

    async def collect(self, http: HTTPRequest, choices: Choices) -> list[tuple[str, str]]:
        """Wait for every choice; (text, finish_reason) each. Aborts all if the client leaves."""
        texts = [[] for _ in choices.seqs]
        reasons: list[str | None] = [None] * len(choices.seqs)
        try:
            while None in reasons:
                try:
                    i, event = await asyncio.wait_for(choices.events.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await http.is_disconnected():
                        raise asyncio.CancelledError from None
                    continue
                if event.error:
                    raise APIError(event.error, code="engine_failed", status=500)
                texts[i].append(event.text)
                reasons[i] = event.finish_reason
        finally:
            self.abort_unfinished(choices, reasons)
        return [("".join(t), r) for t, r in zip(texts, reasons)]


def usage(choices: Choices) -> dict:
    prompt = sum(len(p.ids) for p in {id(s.prompt): s.prompt for s in choices.seqs}.values())
    completion = sum(len(s.tokens) for s in choices.seqs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="specmesh", docs_url=None, redoc_url=None)
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(_, e: APIError):
        kind = "invalid_request_error" if e.status == 400 else "server_error"
        return JSONResponse(error_body(e.message, kind, e.param, e.code), status_code=e.status)

    @app.get("/health")
    async def health():
        if server.engine.failure is not None:
            return JSONResponse({"status": "failed", "error": str(server.engine.failure)}, status_code=503)
        if server.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(server.engine), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": 0,
                                            "owned_by": "specmesh"}]}

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        body = await server.body(http)
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) else [prompt]
        if not prompts:
            raise APIError("prompt is empty", "prompt")
        ids = [server.encode(p, "prompt") for p in prompts]
        choices = server.start(ids, server.params(body, max(len(i) for i in ids)))
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": server.model_name}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return stream(http, server, choices, head, include_usage,
                          lambda i, text, reason: {"text": text, "index": i, "logprobs": None,
                                                   "finish_reason": reason})
        results = await server.collect(http, choices)
        return head | {"choices": [{"text": t, "index": i, "logprobs": None, "finish_reason": r}
                                   for i, (t, r) in enumerate(results)], "usage": usage(choices)}

    @app.post("/v1/chat/completions")
    async def chat(http: HTTPRequest):
        body = await server.body(http)
        ids = server.encode(server.chat_prompt(body.get("messages")), "messages")
        choices = server.start([ids], server.params(body, len(ids)))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": server.model_name}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return stream(http, server, choices, head | {"object": "chat.completion.chunk"}, include_usage,
                          lambda i, text, reason: {"index": i, "delta": {"content": text} if text or not reason
                                                   else {}, "finish_reason": reason},
                          first=lambda i: {"index": i, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None})
        results = await server.collect(http, choices)
        return head | {"object": "chat.completion", "usage": usage(choices), "choices": [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": r}
            for i, (t, r) in enumerate(results)]}

    return app


def stream(http: HTTPRequest, server: Server, choices: Choices, head: dict, include_usage: bool, choice, first=None):
    """Server-sent events, then [DONE]. Each wake-up sends what the engine has produced since, one
    chunk per choice (a speculative step's accepted tokens are one chunk), in one write."""

    async def events():
        done: list[str | None] = [None] * len(choices.seqs)      # each choice's finish_reason
        try:
            if first:
                yield sse(head | {"choices": [first(i) for i in range(len(choices.seqs))]})
            while None in done:
                batch = [await choices.events.get()]
                while not choices.events.empty():
                    batch.append(choices.events.get_nowait())
                texts: dict[int, str] = {}
                for i, event in batch:
                    if event.error:
                        yield sse(error_body(event.error, "server_error", code="engine_failed")) + "data: [DONE]\n\n"
                        return
                    texts[i] = texts.get(i, "") + event.text
                    done[i] = event.finish_reason
                yield "".join(sse(head | {"choices": [choice(i, text, done[i])]}) for i, text in texts.items())
            if include_usage:
                yield sse(head | {"choices": [], "usage": usage(choices)})
            yield "data: [DONE]\n\n"
        finally:
            server.abort_unfinished(choices, done)

    return StreamingResponse(events(), media_type="text/event-stream")
