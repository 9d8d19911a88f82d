"""OpenAI request bodies as pydantic models (`CompletionRequest`, `ChatRequest`) -> token-id prompts and
SamplingParams, checked: the shapes real clients send, the fields this server supports, and the bounds one request
may ask for (docs/serving.md).

Every field is either used, or accepted only with the value that changes nothing (`best_of: 1`, ...),
or refused with a 400 that names it: nothing is silently ignored.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import simdjson
from pydantic import BaseModel, ConfigDict, ValidationError, WrapValidator

from specmesh.lossless.sampling import MAX_LOGIT_BIAS, InvalidParameter, SamplingParams, logit_bias_count
from specmesh.model.tokenizer import Tokenizer

OPENAI_DEFAULTS = {"max_new_tokens": 16, "temperature": 1.0}
PLAIN_CHAT_TEMPLATE = "{role}: {content}\n"     # one line per message, then "assistant:"
PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class APIError(Exception):
    """An error answered in OpenAI's shape: 400 for bad input, 429 when the queue is full, 503 while
    draining, 500 on failure; `headers` go with it (429: Retry-After)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 headers: dict | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.headers = message, param, code, status, headers


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (past a bound: a 400 naming it), and what may wait for a row."""
    max_n: int = 16                 # samples per prompt
    max_prompts: int = 16           # prompts in one completion request
    max_sequences: int = 64         # prompts x n in one request
    max_tokens_total: int = 8192    # max_tokens x n x prompts: the work one request may ask for
    max_stop: int = 4               # stop strings (OpenAI's bound)
    max_stop_chars: int = 256       # characters of one stop string
    max_queued: int = 256           # sequences waiting for a row; past it: 429

    @classmethod
    def for_engine(cls, rows: int, context: int) -> "Limits":
        """Defaults scaled to the engine: n up to its rows, 8 contexts' worth of new tokens per request,
        a queue of 16 batches."""
        return cls(max_n=rows, max_sequences=4 * rows, max_tokens_total=8 * context, max_queued=16 * rows)


def described(what: str):
    """A field's type whose every failure is one ValueError saying what it must be (a union's own errors name
    its members, which a client never wrote)."""
    def check(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"must be {what}") from None
    return WrapValidator(check)


class Strict(BaseModel):
    """No field beyond the declared ones, and no coercion: "1" is not a number, true not an integer."""
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool | None = None


class Request(Strict):
    """The fields both endpoints take, by OpenAI's names."""
    NEUTRAL: ClassVar[dict[str, Any]] = {}      # supported only with the value that changes nothing (not yet else)
    model: Any = None                           # the server checks it (a 404 for another model)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None    # its values checked by SamplingParams, which names the entry
    method: str | None = None                   # specmesh's own: one of the server's --methods (the engine checks)

    @classmethod
    def of(cls, body: dict) -> "Request":
        """The request in `body`, or an APIError naming the first field that is wrong."""
        try:
            request = cls.model_validate(body)
        except ValidationError as e:
            raise field_error(e.errors()[0]) from None
        for name, neutral in request.NEUTRAL.items():
            if getattr(request, name) not in (None, neutral):
                raise APIError(f"{name} is not supported yet (only {neutral!r} is accepted)", name,
                               "unsupported_value")
        if request.stream_options is not None and not request.stream:
            raise APIError("stream_options is only allowed with stream: true", "stream_options")
        return request

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


PROMPT = "a non-empty string, list of strings, token ids or list of token-id lists"


class CompletionRequest(Request):
    NEUTRAL: ClassVar[dict[str, Any]] = {"best_of": 1, "echo": False, "suffix": ""}
    prompt: Annotated[str | list[str] | list[int] | list[list[int]], described(PROMPT)]
    logprobs: int | None = None                 # K alternatives per token
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None

    def logprobs_asked(self) -> int | None:
        """How many top alternatives per token the request asks for, or None."""
        return self.logprobs


class Message(Strict):
    role: str
    content: str | list[dict[str, Any]]         # a string, or text parts


class ChatRequest(Request):
    NEUTRAL: ClassVar[dict[str, Any]] = {"tools": [], "tool_choice": "none", "response_format": {"type": "text"}}
    messages: list[Message]
    logprobs: bool | None = None
    top_logprobs: int | None = None             # K alternatives per token, with logprobs: true
    tools: list | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None

    def logprobs_asked(self) -> int | None:
        if self.top_logprobs is not None and self.logprobs is not True:
            raise APIError("top_logprobs needs logprobs: true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


def field_error(error: dict) -> APIError:
    """pydantic's error as a 400 naming the top-level field: `messages[0].name: Extra inputs are not permitted`."""
    loc, param = error["loc"], str(error["loc"][0])
    if error["type"] == "extra_forbidden" and len(loc) == 1:
        return APIError(f"unsupported field {param!r}", param, "unsupported_field")
    path = param + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:]
                           if isinstance(p, int) or re.fullmatch(r"[a-z_]+", p) and p not in TAGS)
    if error["type"] == "value_error":
        return APIError(f"{path} {error['msg'].removeprefix('Value error, ')}", param)
    return APIError(f"{path}: {error['msg']}", param)


TAGS = {"str", "int", "float", "bool", "list", "dict"}      # the members of a union, as pydantic's errors name them


def sampling_params(request: CompletionRequest | ChatRequest, prompt_tokens: int, prompts: int, context: int,
                    limits: Limits) -> SamplingParams:
    """OpenAI's fields onto SamplingParams, which checks them (its error becomes a 400 naming the field),
    then the request's bounds."""
    chat = isinstance(request, ChatRequest)
    given = {"max_new_tokens": request.max_completion_tokens if request.max_completion_tokens is not None
             else request.max_tokens, "logprobs": request.logprobs_asked(),
             "temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
             "n": request.n, "seed": request.seed, "stop": request.stop, "logit_bias": logit_bias(request.logit_bias)}
    given |= {name: getattr(request, name) for name in PENALTIES}
    if given["max_new_tokens"] is None and chat:
        # a chat answer runs to its end of turn, as OpenAI's and vLLM's do: what the context leaves after the
        # prompt, within the request's bound on new tokens (completions keep OpenAI's 16)
        n = given["n"] if isinstance(given["n"], int) and given["n"] > 0 else 1     # a bad n: its own error below
        given["max_new_tokens"] = max(1, min(context - prompt_tokens, limits.max_tokens_total // (n * prompts)))
    try:
        params = SamplingParams(**OPENAI_DEFAULTS | {k: v for k, v in given.items() if v is not None})
    except InvalidParameter as e:
        name = "max_tokens" if e.param == "max_new_tokens" else \
            "top_logprobs" if e.param == "logprobs" and chat else e.param
        raise APIError(str(e).replace(e.param, name), name) from None
    if prompt_tokens + params.max_new_tokens > context:
        raise APIError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({params.max_new_tokens}) exceeds the "
                       f"context of {context} tokens", "max_tokens", "context_length_exceeded")
    bound(params.n, limits.max_n, "n", "samples per prompt")
    bound(params.n * prompts, limits.max_sequences, "n", "sequences (prompts x n) per request")
    bound(params.max_new_tokens * params.n * prompts, limits.max_tokens_total, "max_tokens",
          "new tokens per request (max_tokens x n x prompts)")
    bound(len(params.stop), limits.max_stop, "stop", "stop strings")
    bound(max((len(s) for s in params.stop), default=0), limits.max_stop_chars, "stop", "characters of a stop string")
    return params


LOOKED_OVER_ABOVE = 64 * 2 ** 10     # bytes of a body that simdjson looks over before json.loads reads it


def refuse_wide_fields(raw: bytes, context: int) -> None:
    """Refuse a top-level field with more values than any valid request holds (logit_bias: MAX_LOGIT_BIAS entries; an
    array: a context of token ids or messages) before any of it becomes Python objects. json.loads holds the GIL the
    engine's thread needs for as long as it builds them (tens of ms for 100,000 small values); simdjson reads the
    document lazily, in a few ms a megabyte. What simdjson cannot read goes on to json.loads, which names the problem."""
    try:
        doc = simdjson.Parser().parse(raw)
    except (ValueError, RuntimeError):                  # not JSON, too deep, a number past 64 bits
        return
    if not isinstance(doc, simdjson.Object):
        return
    bias = doc.get("logit_bias")
    if isinstance(bias, simdjson.Object) and len(bias) > MAX_LOGIT_BIAS:
        raise APIError(logit_bias_count(len(bias)), "logit_bias")
    for name in doc.keys():                             # doc[name], not doc.items(): items would build them
        if isinstance(value := doc[name], simdjson.Array) and len(value) > context:
            raise APIError(f"{name} holds {len(value)} values; no request's {name} holds more than the context "
                           f"({context} tokens)", name)


def logit_bias(value) -> dict | None:
    """OpenAI's logit_bias has token ids as JSON keys (strings): {"50256": -100}."""
    if value is None:
        return None
    if len(value) > MAX_LOGIT_BIAS:                     # before looking at every entry
        raise APIError(logit_bias_count(len(value)), "logit_bias")
    if bad := next((k for k in value if not k.isdigit()), None):
        raise APIError(f"logit_bias keys must be token ids (digits), got {bad!r}", "logit_bias")
    return {int(k): v for k, v in value.items()}


def bound(value: int, limit: int, param: str, what: str) -> None:
    if value > limit:
        raise APIError(f"{what}: {value} is over this server's bound of {limit}", param, "over_bound")


def completion_prompts(request: CompletionRequest, tokenizer: Tokenizer, context: int,
                       limits: Limits) -> list[list[int]]:
    """`prompt` as a string, a list of strings, token ids, or a list of token-id lists."""
    prompt = request.prompt
    if isinstance(prompt, str) or (prompt and all(is_id(t) for t in prompt)):
        prompts = [prompt]
    elif prompt:
        prompts = prompt
    else:
        raise APIError(f"prompt must be {PROMPT}", "prompt")
    bound(len(prompts), limits.max_prompts, "prompt", "prompts per request")
    return [encode(p, tokenizer, context, "prompt") for p in prompts]


def is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def encode(prompt, tokenizer: Tokenizer, context: int, param: str) -> list[int]:
    """Text or token ids -> token ids that fit the context."""
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(f"{param} is empty", param)
        try:
            size, most = len(prompt.encode()), tokenizer.max_token_bytes
        except UnicodeEncodeError as e:                 # JSON's "\ud800" escapes decode to lone surrogates
            raise APIError(f"{param} is not valid Unicode: a lone surrogate at character {e.start}", param) from None
        if most and size >= context * most:             # at least size / most tokens: no need to count them
            raise APIError(f"the prompt has at least {size // most} tokens ({size} bytes); the context holds "
                           f"{context}", param, "context_length_exceeded")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(is_id(t) for t in prompt):
        ids = prompt
        bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise APIError(f"token id {bad[0]} is outside the vocabulary of {tokenizer.vocab_size}", param)
    else:
        raise APIError(f"each {param} must be a non-empty string or a list of token ids", param)
    if len(ids) >= context:
        raise APIError(f"the prompt has {len(ids)} tokens; the context holds {context}", param,
                       "context_length_exceeded")
    return list(ids)


def chat_prompt(messages: list[Message], tokenizer: Tokenizer) -> str:
    """The messages through the tokenizer's chat template (or one `role: content` line each). `content` is a
    string or a list of text parts; roles: system, developer (as system), user, assistant."""
    if not messages:
        raise APIError("messages must be a non-empty list", "messages")
    plain = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise APIError(f"messages[{i}]: role {m.role!r} is not supported; use one of "
                           f"{', '.join(ROLES)}", "messages")
        plain.append({"role": ROLES[m.role], "content": message_text(m.content, i)})
    if tokenizer.chat_template:
        return tokenizer.render_chat(plain)
    return "".join(PLAIN_CHAT_TEMPLATE.format(**m) for m in plain) + "assistant:"


def message_text(content: str | list[dict], i: int) -> str:
    if isinstance(content, str):
        return content
    if not content:
        raise APIError(f"messages[{i}].content must be a string or a non-empty list of text parts", "messages")
    texts = []
    for part in content:
        kind = part.get("type")
        if kind != "text":
            raise APIError(f"messages[{i}].content: parts of type {kind!r} are not supported (text parts only)",
                           "messages")
        if not isinstance(part.get("text"), str):
            raise APIError(f"messages[{i}].content: a text part needs a string `text`", "messages")
        texts.append(part["text"])
    return "".join(texts)
