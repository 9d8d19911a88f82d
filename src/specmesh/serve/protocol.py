"""OpenAI request bodies -> token-id prompts and SamplingParams, checked: the shapes real clients send, the
fields this server supports, and the bounds one request may ask for (docs/serving.md).

Every field is either used, or accepted only with the value that changes nothing (`best_of: 1`, ...),
or refused with a 400 that names it: nothing is silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass

from specmesh.lossless.sampling import MAX_LOGIT_BIAS, InvalidParameter, SamplingParams, logit_bias_count
from specmesh.model.tokenizer import Tokenizer

OPENAI_DEFAULTS = {"max_new_tokens": 16, "temperature": 1.0}
PLAIN_CHAT_TEMPLATE = "{role}: {content}\n"     # one line per message, then "assistant:"
PENALTIES = {"frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias"}
SAMPLING = {"max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop"} | PENALTIES
COMMON = SAMPLING | {"model", "stream", "stream_options", "user"}
# supported only with the value that changes nothing (not implemented yet otherwise)
NEUTRAL = {"best_of": (None, 1), "echo": (None, False), "suffix": (None, ""), "tools": (None, []),
           "tool_choice": (None, "none"), "response_format": (None, {"type": "text"})}
COMPLETION_FIELDS = COMMON | {"prompt", "logprobs"} | set(NEUTRAL) - {"tools", "tool_choice", "response_format"}
CHAT_FIELDS = COMMON | {"messages", "logprobs", "top_logprobs"} | set(NEUTRAL) - {"best_of", "echo", "suffix"}
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


def check_fields(body: dict, known: set[str]) -> None:
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise APIError("user must be a string", "user")
    for name in body:
        if name not in known:
            raise APIError(f"unsupported field {name!r}", name, "unsupported_field")
        if name in NEUTRAL and body[name] not in NEUTRAL[name]:
            raise APIError(f"{name} is not supported yet (only {NEUTRAL[name][1]!r} is accepted)", name,
                           "unsupported_value")


def streaming(body: dict) -> tuple[bool, bool]:
    """`stream` and `stream_options.include_usage`, checked."""
    stream, options = body.get("stream"), body.get("stream_options")
    if stream not in (None, True, False):
        raise APIError(f"stream must be true or false, got {stream!r}", "stream")
    if options is not None:
        if not stream:
            raise APIError("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"} or \
                options.get("include_usage") not in (None, True, False):
            raise APIError('stream_options must be {"include_usage": true or false}', "stream_options")
    return bool(stream), bool((options or {}).get("include_usage"))


def sampling_params(body: dict, prompt_tokens: int, prompts: int, context: int, limits: Limits) -> SamplingParams:
    """OpenAI's fields onto SamplingParams, which checks them (its error becomes a 400 naming the field),
    then the request's bounds."""
    given = {"max_new_tokens": body.get("max_completion_tokens", body.get("max_tokens")),
             "logprobs": requested_logprobs(body),
             "temperature": body.get("temperature"), "top_p": body.get("top_p"), "top_k": body.get("top_k"),
             "n": body.get("n"), "seed": body.get("seed"), "stop": body.get("stop"),
             "logit_bias": logit_bias(body.get("logit_bias"))}
    given |= {name: body.get(name) for name in PENALTIES - {"logit_bias"}}
    if given["max_new_tokens"] is None and "messages" in body:
        # a chat answer runs to its end of turn, as OpenAI's and vLLM's do: what the context leaves after the
        # prompt, within the request's bound on new tokens (completions keep OpenAI's 16)
        n = given["n"] if isinstance(given["n"], int) and given["n"] > 0 else 1     # a bad n: its own error below
        given["max_new_tokens"] = max(1, min(context - prompt_tokens, limits.max_tokens_total // (n * prompts)))
    try:
        params = SamplingParams(**OPENAI_DEFAULTS | {k: v for k, v in given.items() if v is not None})
    except InvalidParameter as e:
        name = "max_tokens" if e.param == "max_new_tokens" else \
            "top_logprobs" if e.param == "logprobs" and "messages" in body else e.param
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


def logit_bias(value) -> dict | None:
    """OpenAI's logit_bias has token ids as JSON keys (strings): {"50256": -100}."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise APIError(f"logit_bias must be an object mapping token ids to numbers in [-100, 100], got "
                       f"{type(value).__name__}", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:                     # before looking at every entry
        raise APIError(logit_bias_count(len(value)), "logit_bias")
    if bad := next((k for k in value if not k.isdigit()), None):
        raise APIError(f"logit_bias keys must be token ids (digits), got {bad!r}", "logit_bias")
    return {int(k): v for k, v in value.items()}


def requested_logprobs(body: dict) -> int | None:
    """How many top alternatives per token the request asks for, or None: completions send `logprobs: K`,
    chat sends `logprobs: true` with `top_logprobs: K`."""
    if "messages" not in body:
        value = body.get("logprobs")
        return None if value is None or value is False else value
    if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
        raise APIError("top_logprobs needs logprobs: true", "top_logprobs")
    if body.get("logprobs") not in (None, False, True):
        raise APIError(f"logprobs must be true or false, got {body['logprobs']!r}", "logprobs")
    return (body.get("top_logprobs") or 0) if body.get("logprobs") else None


def bound(value: int, limit: int, param: str, what: str) -> None:
    if value > limit:
        raise APIError(f"{what}: {value} is over this server's bound of {limit}", param, "over_bound")


def completion_prompts(body: dict, tokenizer: Tokenizer, context: int, limits: Limits) -> list[list[int]]:
    """`prompt` as a string, a list of strings, token ids, or a list of token-id lists."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(is_id(t) for t in prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise APIError("prompt must be a non-empty string, list of strings, token ids or list of token-id lists",
                       "prompt")
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


def chat_prompt(messages, tokenizer: Tokenizer) -> str:
    """The messages through the tokenizer's chat template (or one `role: content` line each). `content` is a
    string or a list of text parts; roles: system, developer (as system), user, assistant."""
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list", "messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(f"messages[{i}] needs a string role", "messages")
        if m["role"] not in ROLES:
            raise APIError(f"messages[{i}]: role {m['role']!r} is not supported; use one of "
                           f"{', '.join(ROLES)}", "messages")
        if extra := sorted(set(m) - {"role", "content"}):
            raise APIError(f"messages[{i}].{extra[0]} is not supported", "messages")
        plain.append({"role": ROLES[m["role"]], "content": message_text(m.get("content"), i)})
    if tokenizer.chat_template:
        return tokenizer.render_chat(plain)
    return "".join(PLAIN_CHAT_TEMPLATE.format(**m) for m in plain) + "assistant:"


def message_text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise APIError(f"messages[{i}].content must be a string or a non-empty list of text parts", "messages")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise APIError(f"messages[{i}].content: parts of type {kind!r} are not supported (text parts only)",
                           "messages")
        if not isinstance(part.get("text"), str):
            raise APIError(f"messages[{i}].content: a text part needs a string `text`", "messages")
        texts.append(part["text"])
    return "".join(texts)
