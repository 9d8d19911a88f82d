"""CoSine's cooperative drafting (Yang et al. 2025, §4.2): several drafters, a router per request, and
confidence-based token fusion into one tree. docs/cosine.md says how each loose point of the paper is read.

Per request (an engine row) the router keeps a score per drafter, M[n] in [0, 1]. It starts from the prompt:
each model drafter reads the prompt's window, and the one whose predictions there are closest to the target's
(cross-entropy against the target's top tokens, from the prefill) starts at START, the others at 0. Each round
it picks `routed` drafters: `top` of them by score, the rest at random among the others. `top` follows the
paper's Explore/Exploit with the coefficients as its text means them: after a round whose accepted length
fell below `explore_below` (τ) it explores (top = round(β k), β = EXPLORE), else it exploits
(top = round(α k), α = EXPLOIT).

Fusion, level by level (K = depth levels): every routed drafter has read the fused spine f_1..f_{i-1}; its
most likely next token x_i^n with probability c_i^n is a candidate; the fused token f_i is the candidate of
highest c. Each drafter then reads two tokens, f_i and its own x_i^n (siblings: it continues from the fused
token and from its own), so its next candidate follows the spine and its own token gets one child of its
own. The tree is the union: the spine, every drafter's own tokens beside it, and their children; it is cut
to the `budget` nodes of highest cumulative confidence. Proposals are deterministic (argmax), so `verify`
draws and matches: lossless at any temperature.

A free drafter (context_drafter.ContextDrafter: prompt lookup, no forward) is not routed: it joins every
round, and `routed` counts it. It alone goes on past the round's depth while it finds tokens (its chain is
bounded by the round's budget), and it reads the root first: where it has a candidate there, the model drafters
sit the round out (a model level costs more than it adds beside a lookup) and its chain is bounded by
`solo_budget` where it is sure (confidence >= SOLO: code that repeats its context, accepted in long runs) and by
`guess_budget` otherwise (a verification about as cheap as one token's); `guess_budget` 0 lets the model
drafters join wherever it is not sure.

After verification drafter n's round score is m = (1/K) Σ_i c·d / (c·d + (1 − c)(1 − d)), with d_i the
cosine similarity (clamped to [0, 1]) of the target's input embeddings of the accepted token i and x_i^n,
0 past the accepted length; M[n] <- (1 − η) M[n] + η m.
"""
from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.model.execution import Batch
from specmesh.proposers.draft_model import DraftModel
from specmesh.runtime.link import PeerError

EXPLOIT, EXPLORE = 1.0, 0.5         # α, β: the share of routed drafters picked by score (the rest at random)
ETA = 0.2                           # the weight of a round's score in the running one
START = 0.5                         # a drafter's score before it was routed
SOLO = 0.8                          # a free drafter this confident at the root drafts a long chain alone
PROMPT_TOP = 32                     # the prompt's routing: the target's most likely tokens compared, per position
PROMPT_SKIP = 16                    # ... past the first tokens of a drafter's window (too little context before),
                                    # and at least as many positions (fewer, as after a prefix-cache hit: no start)
PROMPT_POSITIONS = 64               # ... over the prompt's last positions at most (the drafters read their whole
                                    # window; comparing over 256 routed 112 of 113 held-out prompts alike)
PROMPT_GAP = START                  # the others' start below the drafter the prompt favours: unproven, at 0


def round_score(confidence: list[float], similarity: list[float], accepted: int) -> float:
    """m = (1/K) Σ c·d / (c·d + (1 − c)(1 − d)), d = 0 past the accepted length (K = len(confidence))."""
    total = 0.0
    for i, (c, d) in enumerate(zip(confidence, similarity)):
        d = min(max(d, 0.0), 1.0) if i < accepted else 0.0
        agree, disagree = c * d, (1 - c) * (1 - d)
        total += agree / (agree + disagree) if agree + disagree > 0 else 0.0
    return total / len(confidence) if confidence else 0.0


def route(scores: list[float], routed: int, last_accepted: int | None, explore_below: int,
          rng: random.Random) -> list[int]:
    """The drafters for a round: the best by score, the rest at random (explore after a poor round)."""
    k = min(routed, len(scores))
    share = EXPLORE if last_accepted is not None and last_accepted < explore_below else EXPLOIT
    ranked = sorted(range(len(scores)), key=lambda n: (-scores[n], n))
    top = ranked[:round(share * k)]
    rest = [n for n in ranked if n not in top]
    return sorted(top + rng.sample(rest, k - len(top)))


def keep_best(tree: TokenTree, budget: int) -> TokenTree:
    """The `budget` nodes of highest cumulative confidence (the root always; ancestors before children)."""
    if len(tree) <= budget:
        return tree
    order = sorted(range(1, len(tree)), key=lambda n: (-tree.logp[n], n))[:budget - 1]
    keep = sorted([0] + order)
    new = {old: i for i, old in enumerate(keep)}
    out = TokenTree.root(tree.tokens[0])
    for old in keep[1:]:
        out.add(tree.tokens[old], new[tree.parents[old]], tree.prob[old])
    return out


def trim(sizes: list[int], budget: int, floor: int = 1) -> list[int]:
    """Adaptive speculation: one token off the longest draft (the first of equals) until the sizes fit
    `budget` or every one is down to `floor` (a tree of its root alone: plain decoding)."""
    sizes = list(sizes)
    while sum(sizes) > budget and max(sizes) > floor:
        sizes[sizes.index(max(sizes))] -= 1
    return sizes


@dataclass
class Round:
    """One row's round: which drafters proposed, each one's own tokens and confidences along the spine."""
    drafters: list[int]
    own: dict[int, list[int]] = field(default_factory=dict)
    confidence: dict[int, list[float]] = field(default_factory=dict)


def cross_entropy(logits: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor) -> float:
    """-Σ p·log q over the target's top tokens, averaged over positions: logits [m, V] (q), top_* [m, K] (p)."""
    logq = F.log_softmax(logits.float(), -1)
    return float(-(top_p * logq.gather(-1, top_ids)).sum(-1).mean())


Candidates = tuple[list[list[float]], list[list[int]]]     # a drafter's answer to a read: probs, tokens [B][k]


def most_likely(logits: torch.Tensor) -> Candidates:
    """The most likely token after each node and its probability: logits [B, k, V] -> probs, tokens [B][k] (lists:
    the fusion reads them one by one, which costs microseconds a tensor element)."""
    top = F.softmax(logits.float(), -1).max(-1)
    return top.values.tolist(), top.indices.tolist()


def view_path(view: TokenTree, tokens: list[int]) -> list[int]:
    """The nodes of a drafter's view along the accepted tokens, as far as it goes (the first of two equal
    siblings: the one it continued)."""
    path, node = [], 0
    for t in tokens:
        node = next((c for c in view.children(node) if view.tokens[c] == t), None)
        if node is None:
            break
        path.append(node)
    return path


class Drafter:
    """One of cosine's drafters in this process: a draft model (proposers/draft_model.py) reading the levels
    it is given. A round: begin (the newest token) -> read_root -> read_level ... -> finish per row; after
    each read, `result()` is the most likely next token after each node read and its probability.

    Its view of a row's tree: per level two siblings below the node it continued, the token it continues now
    (the fused one) and its own candidate, so one forward per level reads both (one where they are the same).

    Every drafter (this one, context_drafter.ContextDrafter, remote_drafter.RemoteDrafter) says whether it costs
    no forward (`free`: it joins every round, never routed out) and whether its process died (`dead`: never
    routed)."""
    free = False
    dead = False

    def __init__(self, draft: DraftModel):
        self.draft, self.views, self.continued, self.top = draft, [], [], None
        self.ce: float | None = None            # the last read_prompt's cross-entropy

    def admit(self, row: int, seq: Sequence) -> None:
        self.draft.admit(row, seq)

    def move_row(self, src: int, dst: int) -> None:
        self.draft.move_row(src, dst)

    def begin(self, seqs: list[Sequence]) -> None:
        for b, seq in enumerate(seqs):
            self.draft.pending[b].append(seq.last)
        self.views, self.draft.slots = [TokenTree.root(seq.last) for seq in seqs], {}
        self.continued = [0] * len(seqs)            # per row: the node of its view it continues

    def read_root(self, seqs: list[Sequence]) -> None:
        self.draft._catch_up(seqs)
        self.top = most_likely(self.draft._read_pending(seqs)[:, None])

    def read_level(self, seqs: list[Sequence], pairs: list[tuple[int, int]]) -> None:
        """pairs[b]: (the token row b continues, its own candidate); one token a row where every row's are
        the same (its candidate was fused)."""
        both = any(go_on != own for go_on, own in pairs)
        level = []
        for b, (view, (go_on, own)) in enumerate(zip(self.views, pairs)):
            level = [view.add(go_on, self.continued[b])] + ([view.add(own, self.continued[b])] if both else [])
            self.continued[b] = level[0]
        self.top = most_likely(self.draft._forward_level(seqs, self.views, level))

    def read_prompt(self, row: int, top_ids: torch.Tensor, top_p: torch.Tensor) -> None:
        """Read the row's prompt window whole (a fresh row), comparing its predictions with the target's top tokens
        after the prompt's last m tokens (top_* [m, K]) past the window's first PROMPT_SKIP: `prompt_ce()`."""
        draft = self.draft
        read, draft.pending[row] = draft.pending[row], []
        m = min(len(top_ids), len(read) - PROMPT_SKIP)
        view = draft.cache.view(row, row + 1)
        logits = draft._run(torch.tensor([read], device=draft.model.device), view, True, Batch(last_only=max(m, 1)))[0]
        view.commit_all()
        self.ce = cross_entropy(logits.cpu(), top_ids[-m:], top_p[-m:]) if m >= PROMPT_SKIP else None

    def prompt_ce(self) -> float | None:
        return self.ce

    def result(self) -> Candidates:
        return self.top

    def finish(self, row: int, accepted: list[int]) -> None:
        """Keep what it read of the accepted path; queue the rest."""
        view = self.views[row]
        path = view_path(view, accepted)
        self.draft.keep(row, view, path)
        self.draft.pending[row] += accepted[len(path):]


class FusedDrafters:
    def __init__(self, drafters: list[Drafter], embed: nn.Module, rows: int, routed: int = 2,
                 explore_below: int = 2, budget: int = 16, solo_budget: int = 64, guess_budget: int = 6,
                 routing: bool = True, fusion: bool = True, token_budget: int | None = None,
                 names: list[str] | None = None):
        self.drafters, self.embed = drafters, embed                  # the target's input embedding: ids -> [n, D]
        self.routed, self.explore_below, self.budget = routed, explore_below, budget
        self.solo_budget, self.guess_budget = solo_budget, guess_budget   # the free drafters' rounds alone
        self.caps: list[int] = []                   # per row: this round's tree's nodes at most
        self.token_budget = token_budget            # adaptive speculation: a step's trees hold at most this
        self.names = names or [f"drafter{n}" for n in range(len(drafters))]
        self.routing, self.fusion = routing, fusion
        self.alive = [not d.dead for d in drafters]    # a drafter whose process died: not routed
        self.free = {n for n, d in enumerate(drafters) if d.free}  # no forward: never routed out
        # the router starts from the prompt where model drafters compete (build_cosine asks the prefill for it)
        self.compares_prompt = routing and len(drafters) - len(self.free) > 1
        self.scores = [[START] * len(drafters) for _ in range(rows)]
        self.last: list[int | None] = [None] * rows                   # each row's last accepted length
        self.rngs = [random.Random(row) for row in range(rows)]
        self.rounds: list[Round] = []
        self.levels = 0                 # the last proposal's model-drafter forwards one after another (free ones cost none)

    # -- rows -----------------------------------------------------------------------------------
    def admit(self, row: int, seq: Sequence, prompt_logits: torch.Tensor | None = None) -> None:
        """A new sequence in `row`; prompt_logits [n, V], the target's after the prompt's last n tokens, start its
        router on the model drafter closest to the target there."""
        self._each(lambda n, d: d.admit(row, seq))
        self.scores[row], self.last[row] = [START] * len(self.drafters), None
        self.rngs[row] = random.Random(seq.params.seed if seq.params.seed is not None else row)
        if prompt_logits is not None:
            self._route_by_prompt(row, prompt_logits)

    def _route_by_prompt(self, row: int, logits: torch.Tensor) -> None:
        """Each model drafter reads the prompt's window now and is compared with the target there (the cross-entropy
        of its predictions against the target's top tokens); the others start PROMPT_GAP below the closest."""
        top = F.softmax(logits.float(), -1).topk(PROMPT_TOP, -1)
        models = [n for n in range(len(self.drafters)) if n not in self.free]
        ce = {}
        self._each(lambda n, d: d.read_prompt(row, top.indices.cpu(), top.values.cpu()), models)
        self._each(lambda n, d: ce.__setitem__(n, d.prompt_ce()), models)
        ce = {n: x for n, x in ce.items() if x is not None}
        if ce:
            best = min(ce, key=lambda n: (ce[n], n))
            self.scores[row] = [START if n == best or n not in ce else START - PROMPT_GAP
                                for n in range(len(self.drafters))]

    def move_row(self, src: int, dst: int) -> None:
        self._each(lambda n, d: d.move_row(src, dst))
        self.scores[dst], self.last[dst], self.rngs[dst] = self.scores[src], self.last[src], self.rngs[src]

    def _each(self, call, drafters: list[int] | None = None) -> None:
        """call(n, drafter) on each live one (of `drafters`); a drafter whose process died is dropped, with a
        warning, and generation goes on with the others."""
        for n in drafters if drafters is not None else range(len(self.drafters)):
            if self.alive[n]:
                try:
                    call(n, self.drafters[n])
                except PeerError as e:
                    self.alive[n] = False
                    own = str(e).split("; ")[-1]          # the link names other dead ranks first, this one last
                    warnings.warn(f"cosine: drafter {self.names[n]} is gone and routed no more: {own}")

    def _results(self, active: list[int]) -> dict:
        out = {}
        self._each(lambda n, d: out.__setitem__(n, d.result()), active)
        return out

    # -- proposing --------------------------------------------------------------------------------
    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        B, depth = len(seqs), max(budgets)
        live = [n for n in range(len(self.drafters)) if self.alive[n]]
        free = [n for n in live if n in self.free]
        self.rounds = [self._route(b, live, free) for b in range(B)]
        trees = [TokenTree.root(seq.last) for seq in seqs]
        self._each(lambda n, d: d.begin(seqs))
        active = sorted({n for r in self.rounds for n in r.drafters})
        self.levels = 0
        if depth == 0 or not active:
            return trees
        top, active = self._read_roots(seqs, active, free)

        def reach(n: int, b: int) -> int:
            """How deep drafter n drafts row b: a free one goes on alone past the depth while it finds tokens, to
            the row's cap or the tokens the request still wants."""
            if not budgets[b]:
                return 0
            return min(self.caps[b], seqs[b].remaining) - 1 if n in free else budgets[b]

        if len(active) == 1 and active[0] in free:      # the lookup alone (it had a candidate): its chains, no fusion
            trees = [self._chain(b, tree, active[0], top, reach(active[0], b)) for b, tree in enumerate(trees)]
        else:
            self._fuse(seqs, trees, top, active, free, reach)
        trees = [keep_best(tree, n) for tree, n in zip(trees, self.caps)]
        if self.token_budget is not None:           # adaptive speculation: the longest trees give up nodes
            trees = [keep_best(t, n) for t, n in zip(trees, trim([len(t) for t in trees], self.token_budget))]
        return trees

    def _fuse(self, seqs: list[Sequence], trees: list[TokenTree], top: dict, active: list[int], free: list[int],
              reach: Callable[[int, int], int]) -> None:
        """Grow each row's union tree level by level from the active drafters' candidates (`top`, after their
        roots), each reading the fused spine and its own token, up to reach(n, b) levels."""
        B = len(seqs)
        levels = max(reach(n, b) for n in active for b in range(B))
        self.levels = int(any(n not in free for n in active))     # the roots' read, where a model drafter takes part
        spine = [{n: 0 for n in r.drafters} for r in self.rounds]   # per row: the node each drafter continues
        own = [{} for _ in range(B)]                                 # per row: drafter -> its own node beside
        for level in range(levels):
            for b, (tree, r) in enumerate(zip(trees, self.rounds)):
                cand = {n: (top[n][0][b][0], top[n][1][b][0]) for n in r.drafters
                        if n in top and level < reach(n, b) and top[n][0][b][0] > 0}   # 0: nothing found
                own_child = {n: (top[n][0][b][1], top[n][1][b][1]) for n in own[b]
                             if n in top and len(top[n][0][b]) > 1 and top[n][0][b][1] > 0}
                if cand:
                    self._grow(tree, r, cand, own_child, spine[b], own[b])
            # a drafter that found nothing in any row is done: the context drafter's spine, once lost, stays
            # lost (a model drafter always proposes)
            active = [n for n in active if n in top and self.alive[n] and any(p[0] > 0 for p in top[n][0])
                      and any(level + 1 < reach(n, b) for b in range(B))]
            if not active:
                break
            self._each(lambda n, d: d.read_level(seqs, self._pairs(n, trees, spine, top)), active)
            top = self._results(active)
            self.levels += any(n not in free for n in active)

    def _chain(self, b: int, tree: TokenTree, n: int, top: dict, length: int) -> TokenTree:
        """Row b's tree where free drafter n drafts alone: the chain of its candidates, up to `length` tokens
        (what the level loop grows with no other drafter, without a read per level)."""
        if length and top[n][0][b][0] > 0:
            r = self.rounds[b]
            r.confidence[n], r.own[n] = self.drafters[n].read_chain(b, length)
            for p, x in zip(r.confidence[n], r.own[n]):
                tree.add(x, len(tree) - 1, p)
        return tree

    def _route(self, b: int, live: list[int], free: list[int]) -> Round:
        """Row b's drafters this round: the free ones, and the others' pick by the router (`routed` in all)."""
        if not self.routing:
            return Round(live)
        routable = [n for n in live if n not in free]
        picks = route([self.scores[b][n] for n in routable], max(1, self.routed - len(free)), self.last[b],
                      self.explore_below, self.rngs[b])
        return Round(sorted([routable[i] for i in picks] + free))

    def _read_roots(self, seqs: list[Sequence], active: list[int], free: list[int]) -> tuple[dict, list[int]]:
        """Each active drafter reads up to the root, the free ones first: in a row where one of them has a
        candidate (sure of it, >= SOLO, or with guess_budget) the others sit the round out, and the row's cap
        is set. The candidates by drafter, and who drafts on."""
        first = [n for n in active if n in free]
        self._each(lambda n, d: d.read_root(seqs), first)          # each reads what it has not, up to the root
        top = self._results(first)
        self.caps = [self.budget] * len(self.rounds)
        for b, r in enumerate(self.rounds):
            guess = max((top[n][0][b][0] for n in free if n in top), default=0.0)      # 0: none found
            if guess >= SOLO or guess > 0 and self.guess_budget:
                r.drafters = [n for n in r.drafters if n in free]
                self.caps[b] = self.solo_budget if guess >= SOLO else self.guess_budget
        rest = [n for n in active if n not in free and any(n in r.drafters for r in self.rounds)]
        self._each(lambda n, d: d.read_root(seqs), rest)
        return top | self._results(rest), first + rest

    @staticmethod
    def _pairs(n: int, trees: list[TokenTree], spine: list[dict], top: dict) -> list[tuple[int, int]]:
        """Per row, the two tokens drafter n reads next: the one it continues (the fused token, or with fusion off
        its own) and its own candidate."""
        pairs = []
        for b, tree in enumerate(trees):
            own = top[n][1][b][0]
            pairs.append((tree.tokens[spine[b][n]] if n in spine[b] else own, own))
        return pairs

    def _grow(self, tree: TokenTree, r: Round, cand: dict, own_child: dict, spine: dict, own: dict) -> None:
        """A level of one row's union tree from each routed drafter's candidate (confidence, token), and the
        children of the drafters' own tokens of the level before (own_child); updates spine and own."""
        for n, (p, x) in own_child.items():
            self._child(tree, own[n], x, p)
        own.clear()
        for n, (p, x) in cand.items():
            r.own.setdefault(n, []).append(x)
            r.confidence.setdefault(n, []).append(p)
        if not self.fusion:                             # each drafter follows its own tokens: a union of chains
            for n, (p, x) in cand.items():
                spine[n] = self._child(tree, spine[n], x, p)
            return
        parent = next(iter(spine.values()))
        best = max(cand, key=lambda n: (cand[n][0], -n))
        fused = self._child(tree, parent, cand[best][1], cand[best][0])
        for n, (p, x) in cand.items():
            node = self._child(tree, parent, x, p)
            if node != fused:
                own[n] = node
        for n in spine:
            spine[n] = fused

    @staticmethod
    def _child(tree: TokenTree, parent: int, token: int, prob: float) -> int:
        """The child of `parent` with `token`, added if new."""
        for c in tree.children(parent):
            if tree.tokens[c] == token:
                return c
        return tree.add(token, parent, prob)

    # -- learning the verdicts --------------------------------------------------------------------
    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        for b, (tree, verdict) in enumerate(zip(trees, verdicts)):
            accepted = [tree.tokens[n] for n in verdict.path[1:]]
            r, info = self.rounds[b], self._info(seqs[b])
            for n in r.drafters:
                own = r.own.get(n, [])
                m = round_score(r.confidence.get(n, []), self._similarity(accepted, own), len(accepted))
                self.scores[b][n] = (1 - ETA) * self.scores[b][n] + ETA * m
                matched = next((i for i, (x, a) in enumerate(zip(own, accepted)) if x != a),
                               min(len(own), len(accepted)))          # its tokens' accepted prefix
                info["rounds"][n] += 1
                info["drafted"][n] += len(own)
                info["accepted"][n] += matched
            info["scores"] = [round(x, 4) for x in self.scores[b]]
            info["alive"] = [int(a) for a in self.alive]
            if any(n not in self.free for n in r.drafters):     # the router's explore/exploit follows its own picks
                self.last[b] = verdict.accepted
            self._each(lambda n, d: d.finish(b, accepted))

    def _info(self, seq: Sequence) -> dict:
        """The sequence's per-drafter record (Stats.info): rounds routed, tokens drafted along the fused spine,
        of those the accepted prefix, the router's scores, and which drafters are still routed (alive)."""
        info = seq.stats.info
        if "drafters" not in info:
            zeros = [0] * len(self.drafters)
            info.update(drafters=list(self.names), rounds=list(zeros), drafted=list(zeros), accepted=list(zeros))
        return info

    def _similarity(self, accepted: list[int], own: list[int]) -> list[float]:
        """cos(H(accepted_i), H(own_i)) where both exist, else 0 (H: the target's input embeddings); 1 where the
        tokens are the same, so only the positions that differ (few: a drafter's accepted prefix is the same)
        are computed."""
        k = min(len(accepted), len(own))
        sim = [1.0] * k + [0.0] * (len(own) - k)
        differ = [i for i in range(k) if accepted[i] != own[i]]
        if differ:
            with torch.no_grad():
                cos = F.cosine_similarity(self.embed(torch.tensor([accepted[i] for i in differ])).float(),
                                          self.embed(torch.tensor([own[i] for i in differ])).float(), dim=-1)
            for i, c in zip(differ, cos.tolist()):
                sim[i] = c
        return sim
