"""What a decoding method is: its declaration (options with defaults, needs) and the step the engine runs.

Every method and its options are declared once, in specmesh/options.py (`CARDS`, each with its options'
dataclass): the CLI's flags and help, the server's options and `LLM(**options)` are all read from those
declarations; a MethodSpec is a card with the hooks that build and run the method. What it builds is an engine.method.Method, the
step the engine runs over its rows.
"""
from __future__ import annotations

from collections.abc import Callable
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from specmesh.lossless.sampling import InvalidParameter
from specmesh.model.model import Transformer
from specmesh.model.tokenizer import Tokenizer
from specmesh.options import CARDS, Card, Options, declared


class Remote(Protocol):
    """A method's other processes, seen from rank 0."""
    def close(self) -> None: ...


@dataclass
class Models:
    """What a method runs on: the target, the draft, and the method's other processes, if any."""
    target: Transformer
    draft: Transformer | None = None
    drafters: list[Transformer] = field(default_factory=list)     # cosine's
    drafter_names: list[str] = field(default_factory=list)
    target_ms: dict[int, float] = field(default_factory=dict)      # cosine's: width -> ms of a target forward
    context_drafter: bool = False           # cosine's context n-gram drafter beside them
    target_path: Path | None = None         # the target's checkpoint folder (holds its n-gram cache)
    tokenizer: Tokenizer | None = None      # the target's (an n-gram cache is checked against it)
    remote: Remote | None = None            # pearl's DraftPeer, a pipeline's Pipeline

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
            self.remote = None


@dataclass(frozen=True)
class MethodSpec:
    card: Card                          # its declaration: name, summary, options' dataclass, needs
    build: Callable                     # build(models, configured, runner) -> engine.method.Method
    slack: Callable[[Options], int]     # cache slots a step needs beyond prompt + new tokens
    start: Callable | None = None       # start(models, draft, dtype, options): its other processes
    spread_draft: bool = False          # under --tp: its draft on every rank, layer-parallel groups spread over them
    needs_drafters: bool = False        # several drafters (Models.drafters, option `drafters`): cosine
    check: Callable | None = None       # check(models, options): options that depend on the loaded models
    logprobs: bool = True               # it hands each sequence the target's logits at its tokens (Sequence.score)
    penalties: bool = True              # it applies each sequence's penalties and logit bias (lossless/penalties.py)

    @classmethod
    def of(cls, name: str, build: Callable, slack: Callable[[Options], int], **hooks) -> "MethodSpec":
        """The method declared as CARDS[name] (specmesh/options.py), with the hooks that build and run it."""
        return cls(CARDS[name], build, slack, **hooks)

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def needs_draft(self) -> bool:
        return self.card.needs_draft

    @property
    def max_rows(self) -> int | None:
        """Sequences a step takes at most (None: any)."""
        return None if self.card.batched else 1

    @property
    def defaults(self) -> dict:
        return self.card.defaults

    def check_params(self, params) -> None:
        """What `params` (SamplingParams) asks that this method cannot give: an InvalidParameter naming the field,
        before any work (the CLI asks before a multi-process method starts its processes)."""
        if params.logprobs is not None and not self.logprobs:
            raise InvalidParameter("logprobs", f"logprobs: {self.name} does not report the target's "
                                   "log-probabilities (ar, sd, tree, easyspec, cosine, selfdraft and suffix do)")
        if params.penalties and not self.penalties:
            raise InvalidParameter(params.penalties[0], f"{params.penalties[0]}: {self.name} does not apply "
                                   "penalties or a logit bias yet (every method but the pipelines pp, stpp and "
                                   "pipedec does)")


@dataclass(frozen=True)
class Configured:
    """A method with its options resolved: `config` its options' dataclass holding every one of them, `given`
    the names the caller set (a policy may treat a default differently from a choice)."""
    spec: MethodSpec
    config: Options
    given: frozenset

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def needs_draft(self) -> bool:
        return self.spec.needs_draft

    @property
    def options(self) -> dict:
        """Its options as a dict: name -> value."""
        return dataclasses.asdict(self.config)

    @property
    def slack(self) -> int:
        return self.spec.slack(self.config)


def configure(spec: MethodSpec, options: dict, defaults: dict | None = None) -> Configured:
    """`spec` with `options` applied over `defaults` (a draft's own, catalog.pair_options) over the spec's;
    options of other methods are ignored, unknown ones are an error."""
    unknown = (set(options) | set(defaults or {})) - set(declared())
    if unknown:
        raise ValueError(f"unknown method option(s) {', '.join(sorted(unknown))}; known: {', '.join(declared())}")
    pair, given = ({k: v for k, v in values.items() if v is not None} for values in (defaults or {}, options))
    config = spec.card.make(pair | given)
    return Configured(spec, config, frozenset(k for k in given if k in spec.card.fields))
