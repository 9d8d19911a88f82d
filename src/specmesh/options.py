"""The methods and their options as the command line, `LLM(**options)` and the server take them.

Each method's options are one frozen dataclass (`SdOptions`, ...): a field per option, its default, and its help
in `option(...)`'s metadata, checked when the dataclass is made. Each method is declared once in `CARDS` (its
summary, its options' class, whether it needs a draft, whether it steps a batch). The CLI's flags, the server's
options and docs/methods.md's option table (`python -m specmesh.options --docs docs/methods.md`) are all generated
from these. Nothing here imports torch or the methods, so the CLI builds its parser and help from these alone.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path


def option(default, help: str, *, metavar: str | None = None, least: int = 1, most: float = 1.0,
           choices: tuple[str, ...] = ()):
    """A field of a method's options. Its kind is its default's: an int at least `least`; a float in [0, most)
    (a probability, or with most=inf any number >= 0); a bool (a flag); a str (one of `choices`, where given)."""
    return field(default=default, metadata=dict(help=help, metavar=metavar, least=least, most=most,
                                                choices=choices))


class Options:
    """The base of every method's options dataclass: its fields are checked when it is made."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            problem = invalid(f, getattr(self, f.name))
            if problem:
                raise ValueError(f"{f.name} must be {problem}, got {getattr(self, f.name)!r}")


def invalid(f: dataclasses.Field, value) -> str | None:
    """What `value` must be to be the option `f`, or None where it is."""
    m, kind = f.metadata, type(f.default)
    if kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= m["least"]
        return None if ok else "a positive integer" if m["least"] else "a natural number"
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < m["most"]
        return None if ok else "a probability in [0, 1)" if m["most"] == 1 else "a number >= 0"
    if not isinstance(value, str):
        return "a string"
    return None if not m["choices"] or value in m["choices"] else f"one of {', '.join(m['choices'])}"


# helps shared by several methods' fields
WINDOW = "prompt tokens the draft model reads"
WIDTH = "nodes kept per tree level: w"
CHILDREN = "children per node in the top-k expansion: c"
LOOKUP = ("where the last N or more tokens occurred before (prompt lookup), propose what followed them instead of "
          "drafting (0: off)")
REACH = ("tokens the lookup proposes where it is sure of its match (matches of its length had their first token "
         "accepted 9 times in 10; 0: as deep as the draft)")
SHARED = ("the lookup also sees earlier requests: it matches in one suffix tree over the engine's prompts and outputs "
          "(as `suffix` keeps), not in the request's own text alone")
TIMEOUT = "seconds a rank waits for another before failing"
STAGES = "pipeline stages, one process each"
APART = "run the draft in a process of its own instead of beside stage 0"
POLICIES = ("never", "prefill", "round", "mismatch")     # easyspec's calibration (proposers/fuzzy_draft.py)
GAMMA_RULES = ("measured", "c")                           # pearl's γ rules (methods/pearl.py)


@dataclass(frozen=True)
class ArOptions(Options):
    """ar has no options."""


@dataclass(frozen=True)
class SdOptions(Options):
    gamma: int = option(4, "draft length: tokens the draft proposes a step (in a batch, without it: by batch size)")
    draft_window: int = option(64, WINDOW)
    stop_below: float = option(0.0, "a draft chain ends after a token the draft gives less probability than this "
                               "(0: always gamma tokens)", metavar="P")
    lookup: int = option(0, LOOKUP, least=0)
    lookup_reach: int = option(31, REACH, least=0)
    lookup_shared: bool = option(False, SHARED)


@dataclass(frozen=True)
class DraftTree(Options):
    """The draft model's top-k tree, as `tree` and `easyspec` grow it."""
    gamma: int = option(5, "tree depth: levels the draft grows a step")
    tree_width: int = option(3, WIDTH)
    max_children: int = option(2, CHILDREN)
    draft_window: int = option(64, WINDOW)


@dataclass(frozen=True)
class TreeOptions(DraftTree):
    min_prob: float = option(0.0, "a node is drafted only where its path's probability (the draft's, from the root) "
                             "is at least this; a level with none ends the tree (0: the full tree)", metavar="P")
    lookup: int = option(0, LOOKUP, least=0)
    lookup_reach: int = option(31, REACH, least=0)
    lookup_shared: bool = option(False, SHARED)


@dataclass(frozen=True)
class EasySpecOptions(DraftTree):
    layer_groups: str = option("", "the draft's layers in layer-parallel groups, as sizes in order (1,2,1); default: "
                               "the first and last eighth alone, the rest in pairs", metavar="SIZES")
    calibration: str = option("round", "when the draft's fuzzy cache entries are read again exactly: never, prefill, "
                              "round (after every verification) or mismatch (after a rejection)", metavar="POLICY",
                              choices=POLICIES)


@dataclass(frozen=True)
class CoSineOptions(Options):
    gamma: int = option(5, "the deepest draft a request gets (without it: chosen each step up to this by the "
                        "scheduler)")
    draft_window: int = option(256, WINDOW)
    drafters: str = option("", "its drafters, comma-separated names or folders of draft checkpoints sharing the "
                           "target's tokenizer, and `context` for the context n-gram drafter (default: the target's "
                           "shipped drafters)", metavar="DIR,DIR")
    routed: int = option(2, "drafters routed to a request each round")
    explore_below: int = option(1, "τ, explore (pick drafters partly at random) after a round that accepted fewer "
                                "tokens than this")
    tree_budget: int = option(16, "nodes of the fused tree kept for verification (those of highest confidence)")
    solo_budget: int = option(64, "nodes of the chain the context drafter drafts alone where it is sure of the next "
                              "token (a long repeat of the context)")
    guess_budget: int = option(6, "nodes of the chain the context drafter drafts alone where it has a guess it is "
                               "not sure of (0: the model drafters join those rounds)", least=0)
    token_budget: int = option(64, "Γ_max, tokens a verification takes at most (the scheduler's bound; adaptive "
                               "speculation trims the longest trees to it)")
    lam: float = option(0.05, "λ, the scheduler's weight of verification tokens against time per request",
                        metavar="L", most=float("inf"))
    max_step_ms: int = option(0, "T_max, the scheduler's bound on a step's drafting plus verification in ms "
                              "(0: none)", metavar="MS", least=0)
    drafter_processes: bool = option(False, "each drafter in a process of its own, drafting at the same time as the "
                                     "others (one thread each)")
    timeout: int = option(30, TIMEOUT, metavar="SECONDS")
    no_routing: bool = option(False, "every drafter drafts for every request (ablation)")
    no_fusion: bool = option(False, "each drafter follows its own tokens, no fused spine (ablation)")
    no_scheduler: bool = option(False, "every request speculates every step, to the full depth (ablation)")
    no_adaptive: bool = option(False, "no trimming of trees to the token budget (ablation)")


@dataclass(frozen=True)
class SelfDraftOptions(Options):
    branches: int = option(1, "Self-Draft branches N")
    branch_len: int = option(1, "Self-Draft branch length cap L")
    gram: int = option(6, "n-gram size G")
    max_candidates: int = option(1, "n-gram candidate continuations verified per step")
    ngram_cache: str = option("", "corpus n-gram cache (default: ngram.npz beside the target, if any)",
                              metavar="FILE")


@dataclass(frozen=True)
class SuffixOptions(Options):
    gamma: int = option(12, "levels a proposal goes below the newest token at most (without it: no proposal from "
                        "5 running sequences)")
    tree_tokens: int = option(32, "nodes a proposal holds at most (how many are verified: priced by the forward's "
                              "cost by width)")
    min_prob: float = option(0.05, "a node is proposed where the estimated probability of its path (how often it "
                             "followed, from the root, as far as such matches proved right) is at least this",
                             metavar="P")
    row_cost: float = option(0.0, "what one more token adds to a target forward, as a fraction of a forward's fixed "
                             "part (0: fitted to the steps' times as they run)", metavar="F", most=float("inf"))
    depth: int = option(24, "tokens a path of the suffix tree holds: the matched suffix and the levels below it")
    cache_tokens: int = option(32768, "tokens of prompts and outputs the suffix tree holds (the oldest request's "
                               "dropped first)")
    private: bool = option(False, "each request's tree holds its own text only (prompt lookup's reach; ablation)")


@dataclass(frozen=True)
class PearlOptions(Options):
    gamma: int = option(0, "draft length fixed for every round (0: chosen by gamma_rule)", least=0)
    gamma_rule: str = option("measured", "γ when gamma is 0: measured (each round, the γ with the most expected "
                             "tokens per second from the measured draft step, target forward by width and acceptance "
                             "so far) or c (round(c), the paper's rule)", metavar="RULE", choices=GAMMA_RULES)
    draft_window: int = option(64, WINDOW)
    lookup: int = option(0, LOOKUP, least=0)
    timeout: int = option(30, TIMEOUT, metavar="SECONDS")


@dataclass(frozen=True)
class PpOptions(Options):
    stages: int = option(2, STAGES)
    timeout: int = option(30, TIMEOUT, metavar="SECONDS")


@dataclass(frozen=True)
class PipeDecOptions(Options):
    stages: int = option(2, STAGES)
    tree_width: int = option(3, WIDTH)
    max_children: int = option(2, CHILDREN)
    draft_window: int = option(64, WINDOW)
    draft_apart: bool = option(False, APART)
    timeout: int = option(30, TIMEOUT, metavar="SECONDS")


@dataclass(frozen=True)
class StppOptions(Options):
    stages: int = option(2, STAGES)
    gamma: int = option(4, "tree depth: levels the draft grows before the tree crosses the pipeline")
    tree_width: int = option(4, WIDTH)
    max_children: int = option(4, CHILDREN)
    draft_window: int = option(64, WINDOW)
    draft_apart: bool = option(False, APART)
    timeout: int = option(30, TIMEOUT, metavar="SECONDS")


@dataclass(frozen=True)
class Card:
    """A method as it is declared: what the CLI and the server know of it before anything loads."""
    name: str
    summary: str
    options: type[Options]              # its options' dataclass
    needs_draft: bool
    batched: bool = True                # steps any number of sequences (else its own loop, one at a time)

    @property
    def fields(self) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(self.options)}

    @property
    def defaults(self) -> dict:
        return {name: f.default for name, f in self.fields.items()}

    def make(self, values: dict) -> Options:
        """Its options from `values` (options it does not have are left out); a bad value is a ValueError naming
        the method and the option."""
        try:
            return self.options(**{k: v for k, v in values.items() if k in self.fields})
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None


CARDS: dict[str, Card] = {card.name: card for card in (
    Card("ar", "plain autoregressive decoding of the target: the reference", ArOptions, False),
    Card("sd", "a draft model proposes a chain of γ tokens, the target verifies them in one forward (Leviathan/Chen)",
         SdOptions, True),
    Card("tree", "the draft grows a top-k tree (the best `tree_width` per level), the target verifies it in one "
         "forward with tree attention (SpecInfer-style)", TreeOptions, True),
    Card("easyspec", "EasySpec: the draft grows `tree`'s tree with its layers in layer-parallel groups (fuzzy), and "
         "bonus calibration reads the accepted tokens again exactly", EasySpecOptions, True),
    Card("cosine", "CoSine: several drafters, routed per request by their record, their tokens fused into one tree by "
         "confidence, batches and draft sizes scheduled for the verifier", CoSineOptions, False),
    Card("selfdraft", "Multi-Branch Self-Drafting: no draft model; n-gram candidates and N draft branches in one "
         "target forward", SelfDraftOptions, False),
    Card("suffix", "suffix decoding: no draft model; continuations of the longest matching suffix in a tree over "
         "earlier requests' prompts and outputs and the request's own text, by how often each followed",
         SuffixOptions, False),
    Card("pearl", "PEARL: draft and target in two processes, working at the same time (pre-verify / post-verify); γ "
         "chosen each round from measured costs and acceptance", PearlOptions, True, batched=False),
    Card("pp", "plain pipeline-parallel decoding: the target split into `stages` processes of contiguous layers, one "
         "token per full pass (PipeDec's baseline PP)", PpOptions, False, batched=False),
    Card("pipedec", "PipeDec: the draft grows a dynamic prediction tree one layer per timestep while every pipeline "
         "stage processes the layer it got the timestep before", PipeDecOptions, True, batched=False),
    Card("stpp", "static-tree speculative decoding through the pipeline (PipeDec's baseline STPP)", StppOptions, True,
         batched=False),
)}


# the methods that can share one engine step, each request naming its own (methods/mixed.py)
MIXABLE = ("ar", "sd", "tree", "easyspec", "selfdraft", "suffix")


def method_names(methods: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The methods a request may choose among ("sd,selfdraft,ar" or a list): [] for none; each mixable, once."""
    if methods is None:
        return []
    names = [n.strip() for n in methods.split(",")] if isinstance(methods, str) else list(methods)
    for name in names:
        if name not in MIXABLE:
            raise ValueError(f"methods: {name!r} cannot share a step with other methods; these can: "
                             f"{', '.join(MIXABLE)}")
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"methods: each method once, at least one, got {methods!r}")
    return names


def declared(methods: list[str] | None = None) -> dict[str, list[tuple[Card, dataclasses.Field]]]:
    """Every option name (in order of first declaration) -> the methods (of `methods`, default all) having it."""
    found: dict[str, list] = {}
    for card in CARDS.values():
        if methods is None or card.name in methods:
            for name, f in card.fields.items():
                found.setdefault(name, []).append((card, f))
    return found


def described(having: list[tuple[Card, dataclasses.Field]]) -> list[tuple[str, str]]:
    """One option's helps, each with the methods it is theirs and their defaults ("sd 4, tree 5")."""
    by_help: dict[str, list[str]] = {}
    for card, f in having:
        shown = card.name if isinstance(f.default, bool) or f.default == "" else f"{card.name} {f.default}"
        by_help.setdefault(f.metadata["help"], []).append(shown)
    return [(help, ", ".join(shown)) for help, shown in by_help.items()]


def table() -> str:
    """docs/methods.md's option table: a row per option and meaning, with the methods and their defaults."""
    rows = ["| option | methods (default) | what it sets |", "|---|---|---|"]
    for name, having in declared().items():
        for help, shown in described(having):
            rows.append(f"| `--{name.replace('_', '-')}` | {shown} | {help.replace('|', '/')} |")
    return "\n".join(rows)


BEGIN, END = "<!-- options: generated by python -m specmesh.options --docs -->", "<!-- /options -->"


def write_table(path: Path) -> None:
    """`path` with the text between BEGIN and END replaced by table()."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section to fill")
    head, rest = text.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}")


QUANTS = {"int8": 8, "int4": 4}                  # --quant: name -> bits (model/quant.py)
PEER_WEIGHTS = ("file", "same-precision")        # bench --peer-weights (bench/llamacpp.py)


# -- the values' parsers (argparse types: the CLI's flags and the bench's tools) --------------------------------
def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def natural(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535, got {text}")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m specmesh.options", description="the methods' option table")
    parser.add_argument("--docs", type=Path, metavar="FILE", help="fill FILE's option section (else print the table)")
    args = parser.parse_args()
    write_table(args.docs) if args.docs else print(table())
