"""The generation driver: runs a method's decode loop and applies the stopping rules.

Methods yield blocks of committed tokens per row; this module appends them and
stops each row at EOS (kept in `tokens`, not in `text`), at `max_new_tokens`, or
at a stop string (which cuts `text` before it and `tokens` to the shortest prefix
whose text covers that). Stop strings spanning block boundaries work because the
check runs on the whole decoded text. Row 0's text streams out as it grows,
holding back a tail that could still become a stop string.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from specmesh.job import Job, Models
from specmesh.methods import Method
from specmesh.sampling import SamplingParams, make_generator
from specmesh.stats import Stats
from specmesh.tokenizer import Tokenizer


@dataclass
class Sample:
    text: str
    tokens: list[int]
    finish_reason: str          # "eos" | "length" | "stop"


@dataclass
class Output:
    text: str
    tokens: list[int]
    samples: list[Sample]
    stats: Stats
    prompt_tokens: int = 0

    def to_json(self) -> dict:
        return {"text": self.text, "tokens": self.tokens,
                "samples": [{"text": s.text, "tokens": s.tokens} for s in self.samples],
                "stats": self.stats.to_json()}


class Row:
    """One sample's tokens, text and finish state."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams, eos_ids: set[int], limit: int):
        self.tokenizer, self.params, self.eos_ids, self.limit = tokenizer, params, eos_ids, limit
        self.tokens: list[int] = []
        self.text = ""
        self.finish: str | None = None
        self.streamed = 0
        self.pieces = tokenizer.token_bytes        # byte-level tokenizers: the text grows by bytes
        self.bytes = bytearray()

    def extend(self, new: list[int]) -> None:
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
        self.tokens = self.tokens[:k]
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


class Generation:
    """Iterate for row 0's text pieces; `output` holds the result once iteration ends."""

    def __init__(self, method: Method, models: Models, tokenizer: Tokenizer, prompt: list[int],
                 params: SamplingParams, context: int):
        if not prompt:
            raise ValueError("prompt is empty")
        if len(prompt) >= context:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {context} tokens")
        self.decode, self.models = method.decode, models
        limit = min(params.max_new_tokens, context - len(prompt))
        eos = set(models.target.config.eos_ids)
        self.rows = [Row(tokenizer, params, eos, limit) for _ in range(params.n)]
        # batched methods decode all n rows together; the others one row after another
        self.batch = params.n if method.batched else 1
        self.job = Job(prompt=list(prompt), params=params, generator=make_generator(params.seed, models.target.device),
                       max_len=len(prompt) + limit + method.slack, limit=limit, rows=self.batch)
        self.output: Output | None = None

    def _blocks(self) -> Iterator[list[list[int]]]:
        """Blocks for all rows: one batched decode, or each row's decode in turn (others get [])."""
        for first in range(0, len(self.rows), self.batch):
            rows = self.rows[first:first + self.batch]
            steps = self.decode(self.models, self.job)
            try:
                for blocks in steps:
                    yield [[]] * first + blocks + [[]] * (len(self.rows) - first - len(blocks))
                    if all(r.finish for r in rows):
                        break
            finally:
                steps.close()

    def __iter__(self) -> Iterator[str]:
        stats = self.job.stats
        start = time.perf_counter()
        with torch.inference_mode():
            for blocks in self._blocks():
                for row, block in zip(self.rows, blocks):
                    row.extend(block)
                piece = self.rows[0].stream_piece()
                if piece:
                    yield piece
        stats.elapsed_s = time.perf_counter() - start
        stats.generated_tokens = sum(len(r.tokens) for r in self.rows)
        samples = [Sample(r.text, r.tokens, r.finish or "length") for r in self.rows]
        self.output = Output(samples[0].text, samples[0].tokens, samples, stats, len(self.job.prompt))
        piece = self.rows[0].stream_piece()
        if piece:
            yield piece

    def run(self) -> Output:
        for _ in self:
            pass
        return self.output
