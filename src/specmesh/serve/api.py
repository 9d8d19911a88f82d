"""The OpenAI-compatible HTTP API over the engine (FastAPI).

POST /v1/completions, POST /v1/chat/completions (streaming: server-sent events ending
with `data: [DONE]`), GET /v1/models (and /v1/models/{id}), GET /health, GET /metrics (Prometheus).
Request bodies are read and bounded by protocol.py. Bad requests get 400 with OpenAI's error
body, never 500; when more sequences wait for a row than the bound, 429 with Retry-After; an
engine failure fails the requests in flight (500, or an error event then [DONE] when streaming)
and turns /health to 503; a lost process of a multi-process method (its rank and host named) is a 503 for the
requests in flight and for every later one. While draining (after SIGTERM) new requests get 503.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specmesh.engine.engine import Engine, deliver_here, failure_code
from specmesh.engine.sequence import Sequence
from specmesh.serve.metrics import Metrics
from specmesh.serve.protocol import (LOOKED_OVER_ABOVE, APIError, ChatRequest, CompletionRequest, Limits, Request,
                                     chat_prompt, completion_prompts, encode, refuse_wide_fields, sampling_params)
from specmesh.lossless.sampling import InvalidParameter, SamplingParams

UNAVAILABLE = ("server_shutting_down", "peer_lost")     # error codes answered 503: the service, not the request


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


MAX_BODY_BYTES = 4 * 2 ** 20     # a request body (prompts are bounded by the context anyway)


@dataclass(frozen=True)
class Key:
    """The key every /v1 request must carry as `Authorization: Bearer KEY` (`everywhere`: /health and /metrics
    too); compared in constant time, so the time taken says nothing of how much of a guess was right."""
    secret: str
    everywhere: bool = False

    def guards(self, path: str) -> bool:
        return self.everywhere or path.startswith("/v1/") or path == "/v1"

    def admits(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.secret.encode())


def unauthorized(authorization: str | None) -> JSONResponse:
    """OpenAI's answer to a missing or wrong key (its clients raise AuthenticationError)."""
    message = "Incorrect API key provided" if authorization else \
        "You didn't provide an API key: send it as the header Authorization: Bearer KEY"
    return JSONResponse(error_body(message, "invalid_request_error", code="invalid_api_key"), status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})


@dataclass
class Choices:
    """The choices of one HTTP request: its sequences (its prompts times n, in choice order) and their
    events, as (choice index, Event) in the order the engine produced them."""
    events: asyncio.Queue
    seqs: list[Sequence]
    offsets: dict[tuple[int, int], int] = field(default_factory=dict)    # (choice, token) -> text offset


class Server:
    """State shared by the routes: the engine, the model name, metrics, the request bounds, draining flag. `llm`:
    the LLM the engine belongs to (held, so its models and processes live as long as the server)."""

    def __init__(self, engine: Engine, model_name: str, metrics: Metrics, limits: Limits | None = None, llm=None):
        self.engine, self.model_name, self.metrics, self.llm = engine, model_name, metrics, llm
        self.limits = limits or Limits.for_engine(engine.scheduler.rows, engine.context)
        self.draining = False

    # -- request parsing ----------------------------------------------------------------------
    async def body(self, http: HTTPRequest) -> dict:
        raw = bytearray()
        async for piece in http.stream():       # read no further than the bound
            raw += piece
            if len(raw) > MAX_BODY_BYTES:
                raise APIError(f"request body over {MAX_BODY_BYTES // 2 ** 20} MB", code="body_too_large", status=413)
        data = bytes(raw)                       # one copy, for the look-over and the parse
        if len(data) > LOOKED_OVER_ABOVE:
            refuse_wide_fields(data, self.engine.context)
        try:
            body = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise APIError("request body is not valid UTF-8") from None
        except json.JSONDecodeError as e:
            raise APIError(f"request body is not valid JSON: {e.msg} at position {e.pos}") from None
        except RecursionError:
            raise APIError("request body is nested too deeply") from None
        if not isinstance(body, dict):
            raise APIError("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise APIError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                             "model", "model_not_found", status=404)            # as OpenAI answers it
        return body

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def params(self, request: Request, prompts: list[list[int]]) -> SamplingParams:
        return sampling_params(request, max(len(p) for p in prompts), len(prompts), self.engine.context, self.limits)

    # -- running requests ---------------------------------------------------------------------
    def start(self, prompts: list[list[int]], params: SamplingParams, method: str | None = None) -> Choices:
        """Submit params.n sequences per prompt, decoded by `method` (one of the engine's; default its first)."""
        if self.draining:
            raise APIError("the server is shutting down", code="server_shutting_down", status=503)
        if self.engine.failure is not None:
            raise APIError(f"the engine failed: {self.engine.failure}", code=failure_code(self.engine.failure),
                           status=503)
        waiting = self.engine.scheduler.waiting
        if waiting + len(prompts) * params.n > self.limits.max_queued:
            raise APIError(f"the server is busy: {waiting} sequences wait for a row (at most "
                           f"{self.limits.max_queued}); retry shortly", code="queue_full", status=429,
                           headers={"Retry-After": "1"})
        if self.engine.deliver is deliver_here:             # one wake-up of this loop per engine step
            loop = asyncio.get_running_loop()
            self.engine.deliver = lambda batch: loop.call_soon_threadsafe(deliver_here, batch)
        try:
            seqs = [seq for ids in prompts for seq in self.engine.sequences(ids, params, method)]
        except InvalidParameter as e:                   # what only the engine knows: the vocabulary, the method
            raise APIError(str(e), e.param) from None
        choices = Choices(asyncio.Queue(), seqs)
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
        """Wait for every choice; (text, finish_reason) each. Aborts all as soon as the client leaves."""
        texts = [[] for _ in choices.seqs]
        reasons: list[str | None] = [None] * len(choices.seqs)
        left = asyncio.ensure_future(disconnect(http))
        try:
            while None in reasons:
                event = asyncio.ensure_future(choices.events.get())
                await asyncio.wait({event, left}, return_when=asyncio.FIRST_COMPLETED)
                if not event.done():
                    event.cancel()
                    raise asyncio.CancelledError
                i, event = event.result()
                if event.error:
                    raise APIError(event.error, code=event.error_code,
                                   status=503 if event.error_code in UNAVAILABLE else 500)
                texts[i].append(event.text)
                reasons[i] = event.finish_reason
        finally:
            left.cancel()
            self.abort_unfinished(choices, reasons)
        return [("".join(t), r) for t, r in zip(texts, reasons)]


async def disconnect(http: HTTPRequest) -> None:
    """Returns when the client of a request whose body was read goes away."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def token_text(tokenizer, token: int) -> tuple[str, bytes]:
    pieces = tokenizer.token_bytes
    raw = pieces[token] if pieces is not None and token < len(pieces) else tokenizer.decode([token]).encode()
    return raw.decode("utf-8", "replace"), raw


def completion_logprobs(server: Server, choices: Choices, i: int, start: int, end: int | None = None) -> dict | None:
    """The legacy completions shape for choice i's tokens start..end (None: to the last), or None when not asked
    for."""
    seq = choices.seqs[i]
    if seq.params.logprobs is None:
        return None
    entries, tokens = seq.logprobs[start:end], seq.tokens[start:end]
    text = lambda t: token_text(server.tokenizer, t)[0]          # noqa: E731
    offsets, at = [], choices.offsets.pop((i, start), 0)         # where the chunk before left off
    for t in tokens[:len(entries)]:
        offsets.append(at)
        at += len(text(t))
    choices.offsets[i, start + len(offsets)] = at
    return {"tokens": [text(t) for t in tokens[:len(entries)]], "token_logprobs": [lp for lp, _ in entries],
            "top_logprobs": [{text(a): v for a, v in top} for _, top in entries], "text_offset": offsets}


def chat_logprobs(server: Server, choices: Choices, i: int, start: int, end: int | None = None) -> dict | None:
    """The chat shape for choice i's tokens start..end (None: to the last), or None when not asked for."""
    seq = choices.seqs[i]
    if seq.params.logprobs is None:
        return None

    def entry(token: int, logprob: float) -> dict:
        text, raw = token_text(server.tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    return {"content": [entry(t, lp) | {"top_logprobs": [entry(a, v) for a, v in top]}
                        for t, (lp, top) in zip(seq.tokens[start:end], seq.logprobs[start:end])]}


def usage(choices: Choices) -> dict:
    prompt = sum(len(p.ids) for p in {id(s.prompt): s.prompt for s in choices.seqs}.values())
    completion = sum(len(s.tokens) for s in choices.seqs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def create_app(server: Server, key: Key | None = None) -> FastAPI:
    app = FastAPI(title="specmesh", docs_url=None, redoc_url=None)
    app.state.server = server

    if key is not None:
        @app.middleware("http")
        async def require_key(http: HTTPRequest, call_next):
            authorization = http.headers.get("authorization")
            if key.guards(http.url.path) and not key.admits(authorization):
                return unauthorized(authorization)
            return await call_next(http)

    @app.exception_handler(APIError)
    async def api_error(_, e: APIError):
        kind = "invalid_request_error" if e.status in (400, 404, 413) else "server_error"
        return JSONResponse(error_body(e.message, kind, e.param, e.code), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(http: HTTPRequest, e: StarletteHTTPException):     # an unknown path or method
        message = f"{http.method} {http.url.path}: {e.detail}"
        return JSONResponse(error_body(message, "invalid_request_error", code=str(e.status_code)),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

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

    def model_card() -> dict:
        """OpenAI's model object, and what this server's method allows: the sequences decoded together (1 for a
        multi-process method: one at a time behind the queue), samples per request, the context."""
        engine, limits = server.engine, server.limits
        return {"id": server.model_name, "object": "model", "created": 0, "owned_by": "specmesh",
                "specmesh": {"method": engine.methods[0], "methods": list(engine.methods), "running": engine.scheduler.rows, "max_n": limits.max_n,
                             "max_queued": limits.max_queued, "context": engine.context}}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != server.model_name:
            raise APIError(f"the model {model!r} does not exist; this server serves {server.model_name!r}",
                           "model", "model_not_found", status=404)
        return model_card()

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        request = CompletionRequest.of(await server.body(http))
        streamed, include_usage = bool(request.stream), request.include_usage
        # tokenized in another thread (a long text lets go of the GIL): the loop serves the other streams meanwhile
        ids = await asyncio.to_thread(completion_prompts, request, server.tokenizer, server.engine.context,
                                      server.limits)
        choices = server.start(ids, server.params(request, ids), request.method)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": server.model_name}
        if streamed:
            return stream(http, server, choices, head, include_usage,
                          lambda i, text, reason, start, end: {"text": text, "index": i, "finish_reason": reason,
                                                               "logprobs": completion_logprobs(server, choices, i,
                                                                                               start, end)})
        results = await server.collect(http, choices)
        return head | {"choices": [{"text": t, "index": i, "logprobs": completion_logprobs(server, choices, i, 0),
                                    "finish_reason": r} for i, (t, r) in enumerate(results)], "usage": usage(choices)}

    @app.post("/v1/chat/completions")
    async def chat(http: HTTPRequest):
        request = ChatRequest.of(await server.body(http))
        streamed, include_usage = bool(request.stream), request.include_usage
        ids = await asyncio.to_thread(lambda: encode(chat_prompt(request.messages, server.tokenizer),
                                                     server.tokenizer, server.engine.context, "messages"))
        choices = server.start([ids], server.params(request, [ids]), request.method)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": server.model_name}
        if streamed:
            return stream(http, server, choices, head | {"object": "chat.completion.chunk"}, include_usage,
                          lambda i, text, reason, start, end: {"index": i, "delta": {"content": text} if text or
                                                               not reason else {}, "finish_reason": reason,
                                                               "logprobs": chat_logprobs(server, choices, i, start, end)},
                          first=lambda i: {"index": i, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None})
        results = await server.collect(http, choices)
        return head | {"object": "chat.completion", "usage": usage(choices), "choices": [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": r,
             "logprobs": chat_logprobs(server, choices, i, 0)} for i, (t, r) in enumerate(results)]}

    return app


def stream(http: HTTPRequest, server: Server, choices: Choices, head: dict, include_usage: bool, choice, first=None):
    """Server-sent events, then [DONE]. Each wake-up sends what the engine has produced since, one
    chunk per choice (a speculative step's accepted tokens are one chunk), in one write."""

    async def events():
        done: list[str | None] = [None] * len(choices.seqs)      # each choice's finish_reason
        reported = [0] * len(choices.seqs)                       # each choice's tokens whose logprobs went out
        try:
            if first:
                yield sse(head | {"choices": [first(i) for i in range(len(choices.seqs))]})
            while None in done:
                batch = [await choices.events.get()]
                while not choices.events.empty():
                    batch.append(choices.events.get_nowait())
                texts: dict[int, str] = {}
                ends: dict[int, int] = {}                        # the tokens the events speak for (the engine
                for i, event in batch:                           # thread may have appended more since)
                    if event.error:
                        yield sse(error_body(event.error, "server_error", code=event.error_code)) + "data: [DONE]\n\n"
                        return
                    texts[i] = texts.get(i, "") + event.text
                    ends[i] = max(ends.get(i, reported[i]), event.tokens)
                    done[i] = event.finish_reason
                chunks = []
                for i, text in texts.items():
                    chunks.append(sse(head | {"choices": [choice(i, text, done[i], reported[i], ends[i])]}))
                    reported[i] = ends[i]
                yield "".join(chunks)
            if include_usage:
                yield sse(head | {"choices": [], "usage": usage(choices)})
            yield "data: [DONE]\n\n"
        finally:
            server.abort_unfinished(choices, done)

    return StreamingResponse(events(), media_type="text/event-stream")
