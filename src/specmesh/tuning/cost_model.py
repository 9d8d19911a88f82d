"""`--method auto`'s cost model: a candidate's ms per token from its calibration run and the measured forwards, and
the rules that pick among candidates (specmesh/tuning/__init__.py says what is measured):

    step = target(width) + draft forwards · draft(draft width) + overhead,    ms/token = step / τ

A measured candidate's ms per token is what it measured; the forwards' costs split its step and predict other γ.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from specmesh.timing import by_width

MAX_SD_GAMMA = 8
MARGIN = 0.03           # a speculative method must predict 3% faster than ar (measurement noise)
PAIR_MARGIN = 0.10      # a few calibration prompts must beat the pair's own options (options.json) by 10%


@dataclass
class Trial:
    """One family's calibration run, summed over the calibration prompts."""
    method: str
    options: dict
    tokens: int                 # tokens decoded after the prefill's
    steps: int                  # decoding steps (a verification; ar: a forward)
    target_tokens: int          # tokens through the target's forwards in those steps
    draft_forwards: int
    draft_width: int            # tokens per draft forward (a tree level's width)
    ms: float                   # decoding time

    @property
    def tau(self) -> float:
        return self.tokens / self.steps


@dataclass
class Costs:
    target_ms: dict[int, float]          # width -> ms of a forward after 128 cached tokens
    draft_ms: dict[int, float]


@dataclass
class Candidate:
    method: str
    options: dict
    ms_per_token: float
    reason: str


@dataclass
class Choice:
    """The method for any prompt, and (`kinds`) for each kind of prompt the calibration had (chat, text) where
    it had both: a chat model's answers and its code completions may favour different methods."""
    method: str
    options: dict
    candidates: list[Candidate] = field(default_factory=list)
    key: str = ""
    measured_at: str = ""
    kinds: dict[str, "Choice"] = field(default_factory=dict)
    default_for: str = ""               # not measured: the default for this kind of CPU (DEFAULTS)

    def summary(self) -> str:
        """One line: the choice and its reason (its predicted ms per token, and the runner-up's: the fastest measured
        candidate where one beat the choice, with the rule that kept it), then each kind's choice."""
        if self.default_for:
            return f"auto: {self.label()}: the default on {self.default_for} (not calibrated here: `specmesh tune` or " \
                   f"LLM.tune() measures this machine and caches the choice)"
        if not self.candidates:
            return f"auto: {self.label()}: no draft and no n-gram table to speculate with"
        won = self.won()
        others = [c for c in self.candidates if c is not won]
        beat = [c for c in others if c.reason.endswith("measured") and c.ms_per_token < won.ms_per_token]
        other = min(beat, key=lambda c: c.ms_per_token) if beat else next(iter(others), None)   # a measured faster
        guess = " (predicted, not measured)" if other and other.reason.endswith("predicted") else \
            " (dropped early as too slow)" if other and other.reason.endswith("dropped") else ""
        versus = f"; next {label(other.method, other.options)} {other.ms_per_token:.2f} ms/token{guess}" \
            if other else ""
        if other and not guess and other.ms_per_token < won.ms_per_token:       # a faster runner-up: why it lost
            versus += f" (ar stays unless another is {MARGIN:.0%} faster)" if won.method == "ar" else \
                f" (the draft's own options stay unless another is {PAIR_MARGIN:.0%} faster)"
        kinds = "".join(f"; {kind} prompts: {c.label()} {c.won().ms_per_token:.2f} ms/token"
                        for kind, c in self.kinds.items())
        return f"auto: {self.label()}: {won.ms_per_token:.2f} ms/token, {won.reason}{versus}{kinds}"

    def label(self) -> str:
        return label(self.method, self.options)

    def won(self) -> Candidate:
        return next(c for c in self.candidates if c.method == self.method and c.options == self.options)

    def to_json(self) -> dict:
        return asdict(self) | {"reason": self.summary()}

    @classmethod
    def from_json(cls, entry: dict) -> "Choice":
        return cls(**entry | {"candidates": [Candidate(**c) for c in entry.get("candidates", [])],
                              "kinds": {k: cls.from_json(c) for k, c in entry.get("kinds", {}).items()}})


def label(method: str, options: dict) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in options.items())
    return f"{method}{f' ({opts})' if opts else ''}"


def fitted_alpha(tau: float, gamma: int) -> float:
    """α with (1 − α^(γ+1)) / (1 − α) = τ: the expected tokens of a γ-chain whose drafts each pass with α."""
    tau = min(max(tau, 1.0), gamma + 1 - 1e-6)
    lo, hi = 0.0, 1.0 - 1e-9
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 - mid ** (gamma + 1)) / (1 - mid) < tau else (lo, mid)
    return lo


def predict(costs: Costs, trials: list[Trial]) -> list[Candidate]:
    """Every candidate's ms per token, fastest first."""
    target, draft = by_width(costs.target_ms), by_width(costs.draft_ms)
    out = []
    for t in trials:
        width, step = t.target_tokens / t.steps, t.ms / t.steps
        forwards = target(round(width)) + t.draft_forwards / t.steps * draft(t.draft_width)
        overhead = max(0.0, step - forwards)
        # the costs were measured apart from the run: where the machine ran faster during the run than while the
        # forwards were timed, its predictions are scaled by as much (1 otherwise)
        scale = step / (forwards + overhead)
        out.append(Candidate(t.method, t.options, step / t.tau,
                             f"{t.tau:.2f} tokens per step of {step:.2f} ms (target {width:.1f} "
                             f"tokens {target(round(width)):.2f} ms, {t.draft_forwards / t.steps:.1f} draft forwards, "
                             f"{overhead:.2f} ms other), measured"))
        if t.method == "sd" and not t.options.get("stop_below") and not t.options.get("lookup"):   # geometric τ
            gamma = t.options["gamma"]
            alpha, per_draft = fitted_alpha(t.tau, gamma), t.draft_forwards / t.steps / gamma
            for g in range(1, MAX_SD_GAMMA + 1):
                if g == gamma or any(m.method == "sd" and m.options == t.options | {"gamma": g} for m in trials) \
                        or any(c.options == t.options | {"gamma": g} for c in out if c.method == "sd"):
                    continue                                    # measured itself, or predicted from another γ
                tau = (1 - alpha ** (g + 1)) / (1 - alpha)
                step = scale * (target(g + 1) + g * per_draft * draft(1) + overhead)
                out.append(Candidate("sd", t.options | {"gamma": g}, step / tau,
                                     f"{tau:.2f} tokens per step of {step:.2f} ms (α = {alpha:.2f} fitted to γ = "
                                     f"{gamma}'s τ), predicted"))
    return sorted(out, key=lambda c: c.ms_per_token)


def pick(candidates: list[Candidate], measured: bool = False, pair: dict | None = None) -> Candidate:
    """The fastest (of the measured ones: `measured`); the pair's own sd options (`pair`, its options.json, measured
    on held-out prompt sets) unless the fastest is PAIR_MARGIN faster on the few calibration prompts; `ar` unless a
    speculative method predicts at least MARGIN faster."""
    pool = [c for c in candidates if not measured or c.reason.endswith("measured")]
    ar = next(c for c in pool if c.method == "ar")
    best = pool[0]
    own = next((c for c in pool if pair and c.method == "sd" and c.options == pair and c.reason.endswith("measured")),
               None)
    if own is not None and own.ms_per_token <= best.ms_per_token * (1 + PAIR_MARGIN):
        best = own
    return best if best.ms_per_token < ar.ms_per_token * (1 - MARGIN) else ar


def for_kind(kind: Choice, overall: Choice) -> Choice:
    """A kind of prompt's choice: its own winner on its few calibration prompts where that is PAIR_MARGIN faster there
    than the overall choice (measured on every prompt), else the overall choice: a few prompts of a kind are too few
    to overrule the choice measured on all of them by less (docs/tuning.md)."""
    theirs = next((c for c in kind.candidates if c.method == overall.method and c.options == overall.options), None)
    if theirs is None or kind.won().ms_per_token * (1 + PAIR_MARGIN) < theirs.ms_per_token:
        return kind
    return replace(kind, method=overall.method, options=overall.options)
