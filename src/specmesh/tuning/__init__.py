"""`--method auto`: the fastest lossless method for this machine, model pair and dtype, from a short measurement.

What is measured (`measure_choice`):
* the target's forward by width and the draft's (timing.forward_ms, 128 cached tokens);
* greedy calibration runs of each candidate configuration (`ar`, `sd`, `tree`, `selfdraft`, those the models
  allow) on the calibration prompts (calibration.jsonl): its tokens per step τ, the width of its target
  forward, its draft forwards per step, and its decoding time (the prefill's taken out; the fastest of
  ROUNDS interleaved rounds).

From these `predict` gives every candidate's ms per token:

    step = target(width) + draft forwards · draft(draft width) + overhead,    ms/token = step / τ

where a family's overhead per step (sampling, verification, the draft's catch-up) is what its calibration
run took beyond the modelled forwards; so a calibrated candidate predicts its measured time, and `sd`'s
γ = 1..MAX_SD_GAMMA are extrapolated from its run with a per-draft acceptance α fitted to its τ
((1 − α^(γ+1)) / (1 − α) = τ). The fastest wins; a speculative method must beat `ar` by MARGIN.

Calibrating is a step of its own (`LLM.tune()`, `specmesh tune`, or the CLI's first `auto` run), never part of
building an `LLM`. The choice is cached per machine (CPU, vector units, threads, device), model pair (paths,
sizes, times) and dtype (tune.json in paths.cache_dir(): ~/.cache/specmesh); where none is cached, `auto` runs
its kind of machine's default (DEFAULTS). `pearl` and the pipelines are not candidates: each needs processes
of its own (docs/tuning.md).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from specmesh import catalog, methods
from specmesh.engine.engine import Engine
from specmesh.engine.sequence import Output
from specmesh.engine.stats import Stats
from specmesh.kernels import cache_dir, cpu_name, kernel_version, vector_units
from specmesh.lossless.sampling import SamplingParams
from specmesh.paths import cache_entry, cached_json, stamp
from specmesh.settings import settings
from specmesh.timing import by_width, widths_ms  # noqa: F401  (by_width: re-exported)
from specmesh.tuning.cost_model import (MARGIN, MAX_SD_GAMMA, PAIR_MARGIN, Candidate, Choice, Costs,  # noqa: F401
                                        Trial, fitted_alpha, for_kind, label, pick, predict)

CALIBRATION = Path(__file__).with_name("calibration.jsonl")    # 3 code snippets and 2 chat requests, written for this
NEW_TOKENS = 96         # Self-Draft's n-gram pool grows with its output: 48 tokens underrate it by a third
ROUNDS = 2              # calibration runs per family and prompt, interleaved; the fastest counts
TARGET_WIDTHS = (1, 2, 4, 6, 8, 12, 16)    # sd's extrapolations read up to MAX_SD_GAMMA + 1; wider: flat
DRAFT_WIDTHS = (1, 2, 4, 8)
GUESSES = 3             # rounds of measuring extrapolated winners (each measured γ may crown another extrapolation)
STOP_BELOW = 0.3        # sd's calibrated early stop (a weak draft's chains end where it is unsure)
LOOKUP = 2              # sd's calibrated prompt lookup: proposes what followed the last 2+ tokens where they recur
BUDGET_S = 12.0         # calibration runs' time aimed at (plan; $SPECMESH_TUNE_BUDGET_S overrides it)
DROP = 1.3              # a family this much slower than the fastest on the first prompt(s) runs no more
# auto where nothing is calibrated: by kind of machine (cpu_kind), the first of these the models allow, else ar
# (docs/tuning.md gives the measurements behind them)
DEFAULTS = {"amx": ("sd", "selfdraft"), "avx512": ("sd", "selfdraft"), "avx2": (), "cpu": (), "gpu": ()}


def prompt_kind(tokenizer, ids: list[int]) -> str:
    """"chat" for a prompt that starts as the model's chat template renders one (its first token), else "text"."""
    start = tokenizer.chat_prefix[:1]
    return "chat" if start and list(ids[:1]) == start else "text"


# ---------------------------------------------------------------------------------------------
# measuring


def families(llm, draft: Path | None = None) -> list[tuple[str, dict]]:
    """The candidates' calibration configurations: what the loaded models allow. `sd` is calibrated at
    γ = 6 (where its τ says most about α) and extrapolated, with prompt lookup (LOOKUP), and with lookup and
    chains that stop where the draft is unsure (STOP_BELOW), and at the draft's own options (options.json)
    where those differ; `tree` at its defaults (the full static tree: a wide forward costs little on some CPUs)
    and at the draft's own options (lookup, unlikely nodes left out), `selfdraft` at its defaults and with one
    more n-gram candidate."""
    out = [("ar", {})]
    if draft is not None:
        sd = [{"gamma": 6, "lookup": 0}, {"gamma": 6, "lookup": LOOKUP},
              {"gamma": 6, "stop_below": STOP_BELOW, "lookup": LOOKUP}]
        own = pair_sd(draft)
        if own and all(methods.get("sd", o).options != methods.get("sd", own).options for o in sd):
            sd.append(own)
        own_tree = catalog.pair_options(draft).get("tree")
        out += [("sd", o) for o in sd] + [("tree", {})] + [("tree", own_tree)] * bool(own_tree)
    if has_ngram_table(llm):
        out += [("selfdraft", {}), ("selfdraft", {"max_candidates": 2})]
    return out


def pair_sd(draft: Path | None) -> dict | None:
    """The draft's own sd options (its options.json) as a calibration family holds them: γ, stop_below, lookup."""
    own = catalog.pair_options(draft).get("sd")
    options = own and methods.get("sd", {}, own).options
    return own and {k: options[k] for k in ("gamma", "stop_below", "lookup")}


def has_ngram_table(llm) -> bool:
    return catalog.ngram_for(llm.models.target_path) is not None


def measure_costs(llm) -> Costs:
    draft = llm.models.draft
    return Costs(widths_ms(llm.models.target, TARGET_WIDTHS),
                 widths_ms(draft, DRAFT_WIDTHS) if draft is not None else {1: 0.0})


def calibration_prompts(tokenizer) -> list[str]:
    """The code snippets; for a model with a chat template the chat requests through it first (what such a
    model mostly serves), taking turns with the snippets."""
    rows = [json.loads(line) for line in CALIBRATION.read_text().splitlines() if line.strip()]
    chats = [tokenizer.render_chat([{"role": "user", "content": r["turns"][0]}])
             for r in rows if "turns" in r and tokenizer.chat_template]
    code = [r["prompt"] for r in rows if "prompt" in r]
    return [p for pair in itertools.zip_longest(chats, code) for p in pair if p is not None]


def decode(engine: Engine, prompt: list[int], new_tokens: int, within_s: float | None = None) -> Stats | None:
    """A greedy run's stats; None where it took longer than `within_s`."""
    seqs = engine.sequences(prompt, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
    elapsed = engine.complete([seqs], within_s)
    return None if elapsed is None else Output.of(seqs, elapsed).stats


def trial(name: str, given: dict, runs: list[tuple]) -> Trial:
    """A family's trial from its (full run, one-token run) per prompt: the difference is the decoding."""
    sums = dict(tokens=0, steps=0, target_tokens=0, draft_forwards=0, ms=0.0)
    for full, first in runs:
        steps = full.target_forwards - first.target_forwards
        sums["tokens"] += full.generated_tokens - first.generated_tokens
        sums["steps"] += steps
        sums["target_tokens"] += steps + full.drafted_tokens - first.drafted_tokens
        sums["draft_forwards"] += full.draft_forwards - first.draft_forwards
        sums["ms"] += (full.elapsed_s - first.elapsed_s) * 1e3
    keep = {k: given[k] for k in ("gamma", "stop_below", "lookup", "min_prob", "tree_width", "max_children",
                                  "branches", "branch_len", "max_candidates")
            if k in given and name != "ar"}
    return Trial(name, keep, draft_width=keep.get("tree_width", 1), **sums)


def budget_s() -> float:
    """BUDGET_S, or $SPECMESH_TUNE_BUDGET_S (seconds; 0: the fewest calibration runs, as the tests set it)."""
    chosen = settings().tune_budget_s
    return BUDGET_S if chosen is None else chosen


def plan(costs: Costs, families: int, prompts: int) -> tuple[int, int]:
    """How many calibration prompts, in how many rounds, fit BUDGET_S: a run takes about NEW_TOKENS of ar's
    steps. Every prompt in one round before a second round of fewer: what the prompts hold sways the choice more
    than timing noise (SmolLM2 in bf16 chose `ar` for chat on one chat prompt, 22% behind `sd` on 20). A slow
    model (SmolLM2 in float32 on 2 cores: 23 ms a forward) calibrates on the first two prompts (a chat request
    and a code snippet), not for minutes."""
    run_s = 1.5 * NEW_TOKENS * costs.target_ms[1] / 1e3
    budget = budget_s()
    fit = lambda rounds: int(budget / (run_s * families * rounds))
    rounds = ROUNDS if fit(ROUNDS) >= prompts else 1
    return min(prompts, max(2, fit(rounds))), rounds


def guessed_winners(choice: Choice) -> list[Candidate]:
    """The choice's winners (overall and per kind of prompt) that were extrapolated, not measured, once each."""
    winners = [ch.won() for ch in (choice, *choice.kinds.values())]
    guessed = {json.dumps(c.options, sort_keys=True): c for c in winners if c.reason.endswith("predicted")}
    return list(guessed.values())


def measure_choice(llm, prompts: list[str] | None = None, progress: bool = True,
                   draft: Path | None = None) -> Choice:
    """Measure this machine and pair, and choose. `llm` must have its draft loaded (if any). The families'
    runs are interleaved, in up to ROUNDS rounds (plan), so a machine whose speed drifts slows all of them
    alike; each run that counts is the fastest of its rounds."""
    room = llm.context - NEW_TOKENS - 64             # a prompt's last tokens, where a small model's context is short
    ids = [llm.encode(p) for p in prompts or calibration_prompts(llm.tokenizer)]
    kinds = [prompt_kind(llm.tokenizer, i) for i in ids]
    ids = [i[-room:] for i in ids]
    configs = [methods.get(name, options) for name, options in families(llm, draft)]
    engines: dict[int, Engine] = {}                 # family -> its engine of one row, for all its runs
    dropped: dict[int, int] = {}                    # family -> the prompts it ran before drop_slow dropped it
    best: dict[tuple[int, int, int], object] = {}    # (family, prompt, tokens) -> fastest stats

    def run(which: list[int], bar, screen: bool = False) -> None:
        """The families `which` on every prompt, `rounds` times; `screen`: in the first round, those that cannot win
        are dropped as they show it (drop_slow)."""
        for r in range(rounds):
            for p, prompt in enumerate(ids):
                for f in (f for f in which if f not in dropped):
                    if f not in engines:
                        engines[f] = methods.engine(llm.models, configs[f], llm.tokenizer, 1,
                                                    max(map(len, ids)) + NEW_TOKENS + configs[f].slack)
                    fastest = min((best[g, p, NEW_TOKENS].elapsed_s for g in which if (g, p, NEW_TOKENS) in best),
                                  default=None)
                    screened = screen and r == 0 and f != 0 and fastest is not None    # ar (family 0): the reference
                    stats = decode(engines[f], prompt, NEW_TOKENS, DROP * fastest if screened else None)
                    if stats is None:                           # DROP times the fastest run's time, and not done
                        drop(f, p, bar)
                        continue
                    for n, s in ((NEW_TOKENS, stats), (1, decode(engines[f], prompt, 1))):
                        if (f, p, n) not in best or s.elapsed_s < best[f, p, n].elapsed_s:
                            best[f, p, n] = s
                    bar.update()
                if screen and r == 0 and p + 1 < len(ids):
                    drop_slow(which, p + 1, bar)

    def drop(f: int, ran: int, bar) -> None:
        """Family f runs no more: it ran `ran` prompts whole."""
        dropped[f] = ran
        bar.total -= rounds * len(ids) - ran

    def drop_slow(which: list[int], ran: int, bar) -> None:
        """Families DROP times slower than the fastest on the first `ran` prompts run no more (nor count)."""
        speed = {f: trial(configs[f].name, {}, [(best[f, p, NEW_TOKENS], best[f, p, 1]) for p in range(ran)])
                 for f in which if f not in dropped}
        per_token = {f: t.ms / max(t.tokens, 1) for f, t in speed.items()}
        for f, ms in per_token.items():
            if f != 0 and ms > DROP * min(per_token.values()):
                drop(f, ran, bar)

    pair = pair_sd(draft)

    def choose(measured: bool = False) -> Choice:
        choice = choice_on(list(range(len(ids))), measured)
        if len(set(kinds)) > 1:
            choice.kinds = {k: for_kind(choice_on([p for p, kind in enumerate(kinds) if kind == k], measured), choice)
                            for k in sorted(set(kinds))}
        return choice

    def choice_on(prompts: list[int], measured: bool) -> Choice:
        trials = [trial(method.name, method.options, [(best[f, p, NEW_TOKENS], best[f, p, 1]) for p in prompts])
                  for f, method in enumerate(configs) if f not in dropped]
        candidates = predict(costs, trials)
        won = pick(candidates, measured, pair)
        return Choice(won.method, won.options, candidates + [dropped_candidate(f, prompts) for f in dropped],
                      measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))

    def dropped_candidate(f: int, prompts: list[int]) -> Candidate:
        ran = [p for p in prompts if p < dropped[f]]
        name, options = configs[f].name, trial(configs[f].name, configs[f].options, []).options
        if not ran:         # stopped on the first prompt: slower than DROP x the fastest family's ms per token there
            bound = min(best[g, 0, NEW_TOKENS].elapsed_s / NEW_TOKENS for g in range(len(configs))
                        if (g, 0, NEW_TOKENS) in best) * 1e3 * DROP
            return Candidate(name, options, bound, f"over {DROP}x the fastest run's time on the first prompt "
                                                   f"(stopped), dropped")
        t = trial(name, options, [(best[f, p, NEW_TOKENS], best[f, p, 1]) for p in ran])
        return Candidate(name, options, t.ms / max(t.tokens, 1),
                         f"{t.tau:.2f} tokens per step, over {DROP}x the fastest on {len(ran)} prompt(s), dropped")

    with torch.inference_mode():
        costs = measure_costs(llm)
        count, rounds = plan(costs, len(configs), len(ids)) if prompts is None else (len(ids), ROUNDS)
        ids, kinds = ids[:count], kinds[:count]
        with tqdm(total=rounds * len(configs) * len(ids), desc="auto: calibrating", unit="run",
                  file=sys.stderr, disable=not progress, leave=False) as bar:
            run(list(range(len(configs))), bar, screen=True)
            choice = choose()
            # a winner extrapolated from another γ's acceptance is measured before it is chosen; what it measures
            # may crown another extrapolation (SmolLM2 in float32: γ = 1 predicted fastest, measured slower than
            # ar, then γ = 2 predicted 6% faster than ar), which is measured in turn
            for _ in range(GUESSES):
                if not (guessed := guessed_winners(choice)):
                    break
                configs += [methods.get(c.method, c.options) for c in guessed]
                bar.total += rounds * len(guessed) * len(ids)      # the bar grows: say why
                bar.set_description("auto: measuring a predicted winner")
                run(list(range(len(configs) - len(guessed), len(configs))), bar)
                choice = choose()
            if guessed_winners(choice):
                choice = choose(measured=True)
    return choice


# ---------------------------------------------------------------------------------------------
# the cache


def cache_path() -> Path:
    return cache_dir() / "tune.json"


def cache_key(llm, draft: Path | None) -> str:
    """Machine (CPU model, vector units, threads, device), model pair, dtype and quantization, the kernels they
    run on (their version and the SPECMESH_KERNELS switches, which choose among them), the candidates and the rounds
    of measuring guesses (a new version's kernels, calibration families or rule measure again)."""
    parts = [cpu_name(), vector_units(), f"{torch.get_num_threads()} threads", str(llm.device),
             str(llm.dtype).split(".")[-1], f"quant {llm.models.target.quant}", stamp(llm.models.target_path),
             stamp(draft) if draft else "-", type(llm.models.target.lm_head).__name__,
             f"kernels {kernel_version()} {','.join(sorted(settings().kernels))}", json.dumps(families(llm, draft)),
             f"guesses {GUESSES}"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16] + " " + " | ".join(parts[:6])


def load_cache() -> dict:
    return cached_json(cache_path())


def cached(key: str) -> Choice | None:
    entry = load_cache().get(key)
    return None if entry is None else Choice.from_json(entry)


def store(choice: Choice) -> None:
    cache_entry(cache_path(), choice.key, asdict(choice), indent=1)


def cpu_kind(device: torch.device) -> str:
    """The kind of machine DEFAULTS knows: "amx", "avx512", "avx2" (x86 CPUs by their best vector unit), "cpu" (no
    vector unit specmesh's kernels use) or "gpu"."""
    if device.type != "cpu":
        return "gpu"
    units = vector_units().split("+")
    return next((kind for kind, unit in (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2"))
                 if unit in units), "cpu")


def default_choice(llm, draft: Path | None) -> Choice:
    """auto without a calibration: DEFAULTS' method for this kind of machine, among those the models allow (with a
    draft: `sd` at the draft's own options; an n-gram table: `selfdraft`), else `ar`."""
    kind = cpu_kind(llm.device)
    allowed = {name: options for name, options in (("sd", pair_sd(draft) or {}), ("selfdraft", {}))
               if name == "sd" and draft is not None or name == "selfdraft" and has_ngram_table(llm)}
    method = next((m for m in DEFAULTS[kind] if m in allowed), "ar")
    return Choice(method, allowed.get(method, {}), default_for=f"{kind} {'CPUs' if kind != 'gpu' else ''}".strip())


def choose(llm, measure: bool = False, remeasure: bool = False, prompts: list[str] | None = None,
           progress: bool = True) -> Choice:
    """The cached choice for this machine, pair and dtype; else a new measurement (`measure`, stored), or this kind
    of machine's default. `remeasure`: measure whatever is cached."""
    budget_s()                                  # a bad $SPECMESH_TUNE_BUDGET_S is an error, measured or not
    draft = llm.draft_path
    if len(families(llm, draft)) == 1:
        return Choice("ar", {})
    key = cache_key(llm, draft)
    choice = None if remeasure else cached(key)
    if choice is None and not measure:
        return default_choice(llm, draft)
    if choice is None:
        choice = measure_choice(llm, prompts, progress, draft)
        choice.key = key
        store(choice)
    return choice
