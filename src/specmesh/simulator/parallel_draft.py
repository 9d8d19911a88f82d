"""`specmesh simulate --method pearl`: PEARL's rounds on a virtual clock, the draft and the target each on a device
(a host, with `--link`) of its own.

The tokens are the real algorithm's: methods/pearl.py's `decode` runs here, with the draft rank's side of it
(proposers/remote_chain.py's `ChainDrafter`) called in this process where the real one sends messages, so every
round's width, drafts and verdict are PEARL's. Only time is modelled, from the pipeline simulator's profile (one
thread a rank, as on hosts of one core):

    a round    = max(target(w), hop + γ · step + hop(drafts)) + rank 0's own work
    the prompt = the target's pass over it

target(w): the whole target's forward on w tokens (every layer and the head); step: a drafted token (the profile's
chain level, `level_ms(1)`); hop: a message between the ranks (`Profile.hop`: between hosts with `--link`); rank 0's own
work: its verification and bookkeeping after the drafts arrive, timed as this process runs them (the same code).
γ is fixed (`--gamma`, default 4): the measured rule chooses by wall-clock times a simulation does not have. Not
counted: the draft's read of its prompt window in the first round.
"""
from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import torch

from specmesh.simulator.pipelines import Profile, SimConfig

GAMMA = 4


class LocalDraft:
    """The draft rank in this process, through the interface methods/pearl.py's `decode` has for it (DraftPeer's),
    pricing each round as it begins: `ms` is the rounds' modelled time so far."""

    def __init__(self, model, profile: Profile, target_layers: int):
        self.model, self.profile, self.layers = model, profile, target_layers
        self.draft_ms = profile.level_ms(1)                             # a drafted token
        self.target_ms_by_width, self.lent_ms_by_width = {1: self.target_ms(1)}, None
        self.c = self.target_ms_by_width[1] / self.draft_ms
        self.gamma, self.drafting_ms = GAMMA, 0.0
        self.link = SimpleNamespace(lending=contextlib.nullcontext)    # nothing to lend: each rank has its device
        self.ms, self.rounds, self.asked, self.drafter = 0.0, 0, 0, None
        self.verifying: float | None = None                            # when rank 0's own work began

    def target_ms(self, width: int) -> float:
        return self.profile.stage_ms(width, self.layers, last=True)

    def begin(self, seq, window: int, lookup: int, seed: int) -> None:
        """A job begins: its clock starts with the target's pass over the prompt."""
        from specmesh.proposers.remote_chain import ChainDrafter
        self.drafter = ChainDrafter(self.model, seq.ids, window, seq.limit, seq.params, seed, lookup)
        self.ms, self.rounds, self.verifying = self.target_ms(len(seq.ids)), 0, None

    def decide(self, accepted: int, token: int, gamma: int) -> None:
        """A round begins: all of the last round's drafts accepted (token < 0) leaves γ of them for the target to
        read with the newest (`Rounds.settle`), a correction only itself."""
        if self.verifying is not None:
            self.ms += 1e3 * (time.perf_counter() - self.verifying)
        width = self.asked if token < 0 else 1
        p = self.profile
        self.ms += max(self.target_ms(width), p.hop() + gamma * self.draft_ms + p.hop(8 * (gamma + 1)))
        self.rounds += 1
        self.drafter.decide(accepted, token)
        self.asked = gamma

    def drafts(self, sampling: bool) -> tuple[list[int], torch.Tensor | None]:
        out = self.drafter.draft_chain(self.asked)
        self.verifying = time.perf_counter()
        return out

    def end(self, accepted: int, token: int, sampling: bool) -> list[int]:
        self.drafter.decide(accepted, token)
        return self.drafter.committed


def simulate(cfg: SimConfig, prompts: list[str], gamma: int = GAMMA) -> dict:
    """The JSON of `specmesh simulate --method pearl`, aggregated over the prompts (`tokens`: the first prompt's).
    The prompts go through the engine PEARL runs in (one sequence at a time), so its work each round is timed as
    rank 0's."""
    from tqdm import tqdm
    from specmesh import LLM, catalog, methods
    from specmesh.llm import check_vocabularies
    from specmesh.lossless.sampling import SamplingParams
    from specmesh.model.loader import load_model
    llm = LLM(target=cfg.target, method="ar")               # the target alone: nothing for auto to measure
    draft = catalog.required_draft(llm.models.target_path, cfg.draft, "pearl")
    check_vocabularies(llm.models.target_path, draft)
    target = llm.models.target
    local = LocalDraft(load_model(draft, torch.float32, "cpu", draft=True), cfg.profile, target.config.num_layers)
    pearl = methods.get("pearl", {"gamma": gamma, "draft_window": cfg.draft_window})
    engine = methods.engine(methods.Models(target, remote=local), pearl, llm.tokenizer, 1,
                            target.config.max_position_embeddings + pearl.slack)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens)
    tokens, ms, rounds, first = 0, 0.0, 0, None
    for prompt in tqdm(prompts, desc="simulate pearl", unit="prompt"):
        seqs = engine.sequences(llm.encode(prompt), params)
        with torch.inference_mode():
            engine.complete([seqs])
        tokens, ms, rounds = tokens + len(seqs[0].tokens), ms + local.ms, rounds + local.rounds
        first = seqs[0].tokens if first is None else first
    return {"method": "pearl", "stages": 2, "simulated": True, "profile": cfg.profile.name, "gamma": gamma,
            "ms_per_token": ms / tokens, "tokens_per_s": 1000 * tokens / ms, "tokens_per_timestep": tokens / rounds,
            "hit_rate": None, "tokens": first}
