"""Sequence: the engine's one request type, a single sample of one prompt.

A request for n samples of a prompt is n sequences sharing one `Prompt` (whose prefill they
share). A sequence holds its sampling parameters and seeded generator, the tokens generated so
far and their text, and applies the stopping rules as tokens arrive: EOS (kept in `tokens`,
not in `text`), `max_new_tokens` (`limit`), or a stop string (which cuts `text` before it and
`tokens` to the shortest prefix whose text covers that; strings spanning blocks of tokens work
because the check runs on the whole text). `stream_piece` hands out the text not yet streamed,
holding back a tail that may still become a stop string or an incomplete character.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specmesh.engine.stats import Stats
from specmesh.lossless.penalties import penalty_for
from specmesh.lossless.sampling import SamplingParams
from specmesh.model.tokenizer import Tokenizer


@dataclass
class Prompt:
    """A prompt shared by the n sequences of one request: one prefill serves them all. While some
    of them wait for a cache row, `kv` keeps the prompt's keys and values and `logits` the
    distributions after its last tokens (Runner.prompt_tail)."""
    ids: list[int]
    waiting: int = 1                            # sequences not yet prefilled
    kv: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
    logits: torch.Tensor | None = None           # [n, V], n <= Runner.prompt_tail


@dataclass
class Event:
    """What a streaming client gets after a step: new text, then a finish reason (or an error)."""
    text: str = ""
    finish_reason: str | None = None    # "stop" | "length" once done (OpenAI's names)
    error: str | None = None            # the engine failed, or stopped before the sequence finished
    error_code: str = "engine_failed"   # OpenAI-style code of the error: or "server_shutting_down"
    tokens: int = 0                     # the sequence's tokens after the step: what a stream may report on (the
                                        # engine thread appends more while the event waits to go out)


class Sequence:
    def __init__(self, prompt: Prompt, params: SamplingParams, tokenizer: Tokenizer, eos_ids: set[int],
                 limit: int, generator: torch.Generator, emit: Callable[[Event], None] | None = None):
        self.prompt, self.params, self.tokenizer, self.eos_ids = prompt, params, tokenizer, eos_ids
        self.limit = limit                      # tokens to generate at most (max_new_tokens within the context)
        self.generator = generator
        self.emit = emit                        # the server's: each step's new text goes out through it
        self.tokens: list[int] = []
        self.text = ""
        self.finish: str | None = None          # "eos" | "length" | "stop"
        self.aborted = False                    # its client left
        self.request = 0                        # which request it came in (the scheduler's key)
        self.method: str | None = None          # the engine's method it asked for (None: the engine's first)
        self.stats = Stats()
        self.streamed = 0
        self.pieces = tokenizer.token_bytes     # byte-level tokenizers: the text grows by bytes
        self.bytes = bytearray()
        self.arrival = time.perf_counter()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.loop = None                        # a loop method's decoding loop (methods/loop.py)
        self.logprobs: list[tuple[float, list[tuple[int, float]]]] = []   # per token: its log p, the top ones
        self._scores: torch.Tensor | None = None
        # its penalties and logit bias over the prompt and self.tokens; None: the target's logits as they are
        self.penalty = penalty_for(params, prompt.ids, self.tokens)

    def score(self, logits: torch.Tensor, rows: list[int] | None = None) -> None:
        """The target's logits at the tokens of the block about to be appended: logits[rows[i]] predicted
        token i (rows None: logits [n, V] in order). Their log-probabilities are kept where the parameters
        ask for them; otherwise nothing is gathered."""
        if self.params.logprobs is not None:
            self._scores = logits if rows is None else logits[rows]

    @property
    def ids(self) -> list[int]:
        return self.prompt.ids

    @property
    def last(self) -> int:
        """The newest token: the target has not processed it yet."""
        return self.tokens[-1]

    @property
    def remaining(self) -> int:
        return self.limit - len(self.tokens)

    @property
    def done(self) -> bool:
        return self.finish is not None or self.aborted

    @property
    def finish_reason(self) -> str:
        """OpenAI's name for how it ended."""
        return "stop" if self.finish in ("eos", "stop") else "length"

    def extend(self, new: list[int]) -> None:
        self._keep_logprobs(new)
        for t in new:
            if self.finish:
                break
            self.tokens.append(t)
            if t in self.eos_ids and not self.params.ignore_eos:
                self.finish = "eos"
            else:
                if self.pieces is not None and t < len(self.pieces):     # ids past the vocabulary decode to nothing
                    self.bytes += self.pieces[t]
                if len(self.tokens) >= self.limit:
                    self.finish = "length"
        self.text = self._decode()
        self._apply_stop()
        del self.logprobs[len(self.tokens):]

    def _keep_logprobs(self, new: list[int]) -> None:
        """log_softmax of the target's raw logits (before temperature and filters, as OpenAI reports them)."""
        if self._scores is None:
            return
        logp = self._scores[:len(new)].float().log_softmax(-1)                  # [n, V]
        top = logp.topk(self.params.logprobs, dim=-1) if self.params.logprobs else None
        for i, t in enumerate(new):
            alternatives = list(zip(top.indices[i].tolist(), top.values[i].tolist())) if top is not None else []
            self.logprobs.append((float(logp[i, t]), alternatives))
        self._scores = None

    def _decode(self) -> str:
        """The text of the tokens (less a final EOS): a full decode costs time linear in the output, for
        every new token; the bytes of a byte-level tokenizer's tokens give the same text at C speed."""
        if self.pieces is not None:
            return self.bytes.decode("utf-8", "replace")
        return self.tokenizer.decode(self.tokens[:-1] if self.finish == "eos" else self.tokens)

    def _apply_stop(self) -> None:
        hits = [i for i in (self.text.find(s) for s in self.params.stop) if i >= 0]
        if not hits:
            return
        cut = min(hits)
        self.text, self.finish = self.text[:cut], "stop"
        k = next(k for k in range(len(self.tokens) + 1) if len(self.tokenizer.decode(self.tokens[:k])) >= cut)
        del self.tokens[k:]                     # in place: self.penalty reads this list
        if self.pieces is not None:
            self.bytes = bytearray(b"".join(self.pieces[t] for t in self.tokens if t < len(self.pieces)))

    def stream_piece(self) -> str:
        """Text not yet streamed, less a tail that may be an incomplete character or stop string."""
        end = len(self.text)
        if not self.finish:
            end -= max((k for s in self.params.stop for k in range(1, len(s)) if self.text.endswith(s[:k])),
                       default=0)
            if self.text.endswith("\ufffd"):
                end = min(end, len(self.text) - 1)
        piece = self.text[self.streamed:end] if end > self.streamed else ""
        self.streamed += len(piece)
        return piece


@dataclass
class Sample:
    text: str
    tokens: list[int]
    finish_reason: str          # "eos" | "length" | "stop"
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None   # per token: log p, [(id, log p)] top


@dataclass
class Output:
    """What `LLM.generate` returns for one prompt: its n samples; `text`/`tokens` are the first's."""
    text: str
    tokens: list[int]
    samples: list[Sample]
    stats: Stats
    prompt_tokens: int = 0

    @classmethod
    def of(cls, seqs: list[Sequence], elapsed_s: float) -> "Output":
        samples = [Sample(s.text, s.tokens, s.finish or "length",
                          s.logprobs if s.params.logprobs is not None else None) for s in seqs]
        stats = Stats.total([s.stats for s in seqs])
        stats.elapsed_s = elapsed_s
        return cls(samples[0].text, samples[0].tokens, samples, stats, len(seqs[0].ids))

    def to_json(self) -> dict:
        return {"text": self.text, "tokens": self.tokens,
                "samples": [{"text": s.text, "tokens": s.tokens} | ({} if s.logprobs is None else {"logprobs": [
                    {"logprob": lp, "top": [[t, v] for t, v in top]} for lp, top in s.logprobs]})
                    for s in self.samples],
                "stats": self.stats.to_json()}

