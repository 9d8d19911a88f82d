"""The methods and their options as the command line, `LLM(**options)` and the server take them: each option
declared once (`OPTIONS`: its help and kind) and each method once (`CARDS`: its summary, its options with their
defaults, whether it needs a draft, whether it steps a batch). Nothing here imports torch or the methods, so
the CLI builds its parser and help from these alone; methods/ builds each method's step on its card.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass


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
class Card:
    """A method as it is declared: what the CLI and the server know of it before anything loads."""
    name: str
    summary: str
    defaults: dict                      # its options, with their defaults
    needs_draft: bool
    batched: bool = True                # steps any number of sequences (else its own loop, one at a time)


CARDS: dict[str, Card] = {card.name: card for card in (
    Card("ar", "plain autoregressive decoding of the target: the reference", {}, False),
    Card("sd", "a draft model proposes a chain of γ tokens, the target verifies them in one forward (Leviathan/Chen)",
         {"gamma": 4, "draft_window": 64, "stop_below": 0.0, "lookup": 0, "lookup_reach": 31}, True),
    Card("tree", "the draft grows a top-k tree (the best `tree_width` per level), the target verifies it in one "
         "forward with tree attention (SpecInfer-style)",
         {"gamma": 5, "tree_width": 3, "max_children": 2, "draft_window": 64, "min_prob": 0.0, "lookup": 0,
          "lookup_reach": 31}, True),
    Card("easyspec", "EasySpec: the draft grows `tree`'s tree with its layers in layer-parallel groups (fuzzy), and "
         "bonus calibration reads the accepted tokens again exactly",
         {"gamma": 5, "tree_width": 3, "max_children": 2, "draft_window": 64, "layer_groups": "",
          "calibration": "round"}, True),
    Card("cosine", "CoSine: several drafters, routed per request by their record, their tokens fused into one tree by "
         "confidence, batches and draft sizes scheduled for the verifier",
         {"gamma": 5, "draft_window": 256, "drafters": "", "routed": 2, "explore_below": 1, "tree_budget": 16,
          "solo_budget": 64, "guess_budget": 6, "token_budget": 64, "lam": 0.05, "max_step_ms": 0,
          "drafter_processes": False, "timeout": 30, "no_routing": False, "no_fusion": False, "no_scheduler": False,
          "no_adaptive": False}, False),
    Card("selfdraft", "Multi-Branch Self-Drafting: no draft model; n-gram candidates and N draft branches in one "
         "target forward", {"branches": 1, "branch_len": 1, "gram": 6, "max_candidates": 1, "ngram_cache": ""}, False),
    Card("pearl", "PEARL: draft and target in two processes, working at the same time (pre-verify / post-verify); γ "
         "chosen each round from measured costs and acceptance",
         {"gamma": 0, "gamma_rule": "measured", "draft_window": 64, "lookup": 0, "timeout": 30},   # γ 0: by gamma_rule
         True, batched=False),
    Card("pp", "plain pipeline-parallel decoding: the target split into `stages` processes of contiguous layers, one "
         "token per full pass (PipeDec's baseline PP)", {"stages": 2, "timeout": 30}, False, batched=False),
    Card("pipedec", "PipeDec: the draft grows a dynamic prediction tree one layer per timestep while every pipeline "
         "stage processes the layer it got the timestep before",
         {"stages": 2, "tree_width": 3, "max_children": 2, "draft_window": 64, "draft_apart": False, "timeout": 30},
         True, batched=False),
    Card("stpp", "static-tree speculative decoding through the pipeline (PipeDec's baseline STPP)",
         {"stages": 2, "gamma": 4, "tree_width": 4, "max_children": 4, "draft_window": 64, "draft_apart": False,
          "timeout": 30}, True, batched=False),
)}
SERVED = [name for name, card in CARDS.items() if card.batched]     # the methods `serve` runs (batched)


def having(option: str) -> list[Card]:
    """The methods that have `option`."""
    return [card for card in CARDS.values() if option in card.defaults]


QUANTS = {"int8": 8, "int4": 4}                  # --quant: name -> bits (model/quant.py)
PEER_WEIGHTS = ("file", "same-precision")        # bench --peer-weights (bench/llamacpp.py)
POLICIES = ("never", "prefill", "round", "mismatch")     # easyspec's calibration (proposers/fuzzy_draft.py)


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
