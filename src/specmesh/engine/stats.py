"""The counters every method fills in: one set of names, per sequence and for the whole engine."""
from __future__ import annotations

from dataclasses import dataclass, field

COUNTERS = ("target_forwards", "draft_forwards", "generated_tokens", "drafted_tokens", "accepted_tokens",
            "verifications", "phases", "timesteps", "decisions", "hits", "draft_s", "verify_s")


@dataclass
class Stats:
    target_forwards: int = 0        # target forwards this sequence took part in, its prefill as one (however chunked)
    draft_forwards: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0         # draft tokens sent to the target for verification
    accepted_tokens: int = 0        # of those, accepted
    verifications: int = 0          # verification forwards
    elapsed_s: float = 0.0          # wall time, prefill included
    draft_s: float = 0.0            # speculative steps: wall time proposing (the steps this sequence was in)
    verify_s: float = 0.0           # and in the target's verification forward
    phases: int = 0                 # pearl: drafting phases (each ends at a rejection or at the end)
    timesteps: int = 0              # pipelines: stage steps (pipedec: timesteps, the prompt's pass excluded)
    decisions: int = 0              # pipedec: roots the last stage finished
    hits: int = 0                   # pipedec: of those, roots whose next token was one of their children
    info: dict = field(default_factory=dict)     # method-specific figures (pearl: c, gamma)

    @classmethod
    def total(cls, parts: list["Stats"]) -> "Stats":
        """The counters summed (a request's n samples); `info` from the first. Times too, so where samples shared
        a step its draft_s and verify_s count once per sample (they can add up past elapsed_s)."""
        out = cls(**{c: sum(getattr(p, c) for p in parts) for c in COUNTERS})
        out.info = dict(parts[0].info) if parts else {}
        return out

    @property
    def tokens_per_forward(self) -> float | None:
        return self.generated_tokens / self.target_forwards if self.target_forwards else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        return self.accepted_tokens / self.verifications if self.verifications else None

    @property
    def mat(self) -> float | None:
        """PEARL's mean accepted tokens: accepted drafts per drafting phase."""
        return self.accepted_tokens / self.phases if self.phases else None

    def to_json(self) -> dict:
        return {"target_forwards": self.target_forwards,
                "draft_forwards": self.draft_forwards if self.draft_forwards else None,
                "tokens_per_forward": self.tokens_per_forward, "tokens_per_s": self.tokens_per_s,
                "acceptance_rate": self.acceptance_rate}


@dataclass
class EngineStats(Stats):
    """The engine's totals (what /metrics reports): `target_forwards` counts forwards actually run
    (one forward serves many rows), `prefills` the prompts' prefill forwards among them."""
    prefills: int = 0
    cached_prompt_tokens: int = 0   # prompt tokens read from the prefix cache instead of computed
    steps: int = 0
    running: int = 0
    waiting: int = 0
    prefill_pending: int = 0        # tokens of the prompt being computed in chunks not computed yet

    def add(self, stats: Stats) -> None:
        """Take in a finished sequence's draft counters (target forwards are counted where they run)."""
        for name in ("draft_forwards", "drafted_tokens", "accepted_tokens", "verifications"):
            setattr(self, name, getattr(self, name) + getattr(stats, name))

