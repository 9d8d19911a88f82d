"""What a decoding method is: its declaration (options with defaults, needs) and the step the engine runs.

Every option is declared once, here (`OPTIONS`: its help and kind) and in each method's spec (its
default there): the CLI's flags and help, the server's options and `LLM(**options)` are all read
from these declarations.

A method instance runs over the engine's running sequences (running[i] holds cache row i):
  admit(seq, row) -> tokens   sets up a new sequence (prefill, proposer state); its first tokens
  step(seqs) -> blocks        one step for every running sequence: the tokens each committed
  move_row(src, dst)          the engine moved a sequence to another row (a finished one left)
  release(seq)                the sequence left the batch
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from specmesh.engine.sequence import Sequence
from specmesh.model.model import Transformer
from specmesh.model.tokenizer import Tokenizer
from specmesh.spec.sampling import InvalidParameter


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


class Method(Protocol):
    def admit(self, seq: Sequence, row: int) -> list[int]: ...
    def step(self, seqs: list[Sequence]) -> list[list[int]]: ...
    def move_row(self, src: int, dst: int) -> None: ...
    def release(self, seq: Sequence) -> None: ...


@dataclass(frozen=True)
class Option:
    help: str
    kind: type = int            # int: an integer >= least; float: a number in [0, most); bool: a flag; str: text
    metavar: str | None = None
    least: int = 1
    most: float = 1.0           # float: a probability, or (inf) any number >= 0


OPTIONS = {
    "gamma": Option("draft length / tree depth (sd without it in a batch: by batch size; pearl without it: "
                    "by gamma_rule; cosine without it: chosen each step up to its default by the scheduler)"),
    "gamma_rule": Option("pearl's γ when gamma is not given: measured (each round, the γ with the most expected "
                         "tokens per second from the measured draft step, target forward by width and acceptance "
                         "so far) or c (round(c), the paper's rule)", str, "RULE"),
    "draft_window": Option("prompt tokens the draft model reads"),
    "stop_below": Option("a draft chain ends after a token the draft gives less probability than this (0: always "
                         "gamma tokens)", float, "P"),
    "min_prob": Option("tree: a node is drafted only where its path's probability (the draft's, from the root) is "
                       "at least this; a level with none ends the tree (0: the full tree)", float, "P"),
    "lookup": Option("sd, tree, pearl: where the last N or more tokens occurred before (prompt lookup), propose "
                     "what followed them instead of drafting (0: off)", metavar="N", least=0),
    "lookup_reach": Option("sd, tree: tokens the lookup proposes where it is sure of its match (matches of its length "
                           "had their first token accepted 9 times in 10; 0: as deep as the draft)", least=0),
    "layer_groups": Option("easyspec: the draft's layers in layer-parallel groups, as sizes in order (1,2,1); "
                           "default: the first and last eighth alone, the rest in pairs", str, "SIZES"),
    "calibration": Option("easyspec: when the draft's fuzzy cache entries are read again exactly: never, prefill, "
                          "round (after every verification) or mismatch (after a rejection)", str, "POLICY"),
    "tree_width": Option("nodes kept per tree level: w"),
    "max_children": Option("children per node in the top-k expansion: c"),
    "branches": Option("Self-Draft branches N"),
    "branch_len": Option("Self-Draft branch length cap L"),
    "gram": Option("n-gram size G"),
    "max_candidates": Option("n-gram candidate continuations verified per step"),
    "ngram_cache": Option("corpus n-gram cache (default: ngram.npz beside the target, if any)", str, "FILE"),
    "drafters": Option("cosine: its drafters, comma-separated names or folders of draft checkpoints sharing the "
                       "target's tokenizer, and `context` for the context n-gram drafter (default: the target's "
                       "shipped drafters)", str, "DIR,DIR"),
    "routed": Option("cosine: drafters routed to a request each round"),
    "explore_below": Option("cosine: τ, explore (pick drafters partly at random) after a round that accepted fewer "
                            "tokens than this"),
    "tree_budget": Option("cosine: nodes of the fused tree kept for verification (those of highest confidence)"),
    "solo_budget": Option("cosine: nodes of the chain the context drafter drafts alone where it is sure of the next "
                          "token (a long repeat of the context)"),
    "guess_budget": Option("cosine: nodes of the chain the context drafter drafts alone where it has a guess it is "
                           "not sure of (0: the model drafters join those rounds)", least=0),
    "token_budget": Option("cosine: Γ_max, tokens a verification takes at most (the scheduler's bound; adaptive "
                           "speculation trims the longest trees to it)"),
    "lam": Option("cosine: λ, the scheduler's weight of verification tokens against time per request", float, "L",
                  most=float("inf")),
    "max_step_ms": Option("cosine: T_max, the scheduler's bound on a step's drafting plus verification in ms "
                          "(default 0: none)", metavar="MS", least=0),
    "no_scheduler": Option("cosine: every request speculates every step, to the full depth (ablation)", bool),
    "no_adaptive": Option("cosine: no trimming of trees to the token budget (ablation)", bool),
    "drafter_processes": Option("cosine: each drafter in a process of its own, drafting at the same time as the "
                                "others (one thread each)", bool),
    "no_routing": Option("cosine: every drafter drafts for every request (ablation)", bool),
    "no_fusion": Option("cosine: each drafter follows its own tokens, no fused spine (ablation)", bool),
    "timeout": Option("seconds a rank waits for another before failing", metavar="SECONDS"),
    "stages": Option("pipeline stages, one process each"),
    "draft_apart": Option("run the draft S in a process of its own instead of beside stage 0", bool),
}


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    defaults: dict                      # its options, with their defaults
    needs_draft: bool
    build: Callable                     # build(models, options, rows, max_len, stats) -> Method
    slack: Callable[[dict], int]        # cache slots a step needs beyond prompt + new tokens
    start: Callable | None = None       # start(models, draft, dtype, options): its other processes
    max_rows: int | None = None         # sequences a step takes at most (None: any)
    spread_draft: bool = False          # under --tp: its draft on every rank, layer-parallel groups spread over them
    needs_drafters: bool = False        # several drafters (Models.drafters, option `drafters`): cosine
    check: Callable | None = None       # check(models, options): options that depend on the loaded models
    logprobs: bool = True               # it hands each sequence the target's logits at its tokens (Sequence.score)
    penalties: bool = True              # it applies each sequence's penalties and logit bias (spec/penalties.py)

    def check_params(self, params) -> None:
        """What `params` (SamplingParams) asks that this method cannot give: an InvalidParameter naming the field,
        before any work (the CLI asks before a multi-process method starts its processes)."""
        if params.logprobs is not None and not self.logprobs:
            raise InvalidParameter("logprobs", f"logprobs: {self.name} does not report the target's "
                                   "log-probabilities (ar, sd, tree, easyspec, cosine and selfdraft do)")
        if params.penalties and not self.penalties:
            raise InvalidParameter(params.penalties[0], f"{params.penalties[0]}: {self.name} does not apply "
                                   "penalties or a logit bias yet (every method but the pipelines pp, stpp and "
                                   "pipedec does)")


@dataclass(frozen=True)
class Configured:
    """A method with its options resolved: `options` holds every one of its options, `given` those the
    caller set (a policy may treat a default differently from a choice)."""
    spec: MethodSpec
    options: dict
    given: frozenset

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def needs_draft(self) -> bool:
        return self.spec.needs_draft

    @property
    def slack(self) -> int:
        return self.spec.slack(self.options)


def configure(spec: MethodSpec, options: dict, defaults: dict | None = None) -> Configured:
    """`spec` with `options` applied over `defaults` (a draft's own, catalog.pair_options) over the spec's;
    options of other methods are ignored, unknown ones are an error."""
    unknown = (set(options) | set(defaults or {})) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown method option(s) {', '.join(sorted(unknown))}; known: {', '.join(OPTIONS)}")
    pair, given = ({k: v for k, v in values.items() if k in spec.defaults and v is not None}
                   for values in (defaults or {}, options))
    for k, v in (pair | given).items():
        kind = OPTIONS[k].kind
        if kind is bool and not isinstance(v, bool):
            raise ValueError(f"{spec.name}: {k} must be true or false, got {v!r}")
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < OPTIONS[k].least):
            raise ValueError(f"{spec.name}: {k} must be a {'positive integer' if OPTIONS[k].least else 'natural number'}"
                             f", got {v!r}")
        if kind is float and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < OPTIONS[k].most):
            raise ValueError(f"{spec.name}: {k} must be "
                             f"{'a probability in [0, 1)' if OPTIONS[k].most == 1 else 'a number >= 0'}, got {v!r}")
        if kind is str and not isinstance(v, str):
            raise ValueError(f"{spec.name}: {k} must be a string, got {v!r}")
    return Configured(spec, spec.defaults | pair | given, frozenset(given))
