"""The one lossless verification core, for chains and trees, greedy and sampling.

Given a TokenTree and the target's logits at every node ([N, V], one forward),
walk down from the root:

* greedy: follow the child whose token is the target's argmax; the token after
  the last accepted node is the argmax there.
* deterministic proposals (top-k children, n-gram candidates, fused tokens): draw
  x ~ p at the node and follow the child holding x, else stop with x. Every
  emitted token is a draw from p, so the output distribution is the target's.
* proposals drawn i.i.d. from the draft distribution q (`tree.sampled`): try the
  children in order; child x is accepted with probability min(1, p(x)/q(x)); on a
  rejection p <- norm(max(0, p - q)) and the next child is tried (SpecInfer's
  multi-step rejection; with one child this is the standard chain rule); when
  every child is rejected, x ~ p (the residual); at a leaf the bonus token x ~ p.

With a request's `penalty` (lossless/penalties.py), each node's logits are penalised over the generated
tokens plus that node's own path before anything else: p is the penalised target at every node.

`logits` may lack the rows of the deepest nodes (PEARL's post-verify checks its newest
draft with the logits of the node before it, before the target has processed it): a
walk that accepts such a node ends there with no next token.

Stopping at EOS and at max_new_tokens is the generation driver's job: it cuts the
emitted block there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specmesh.lossless.penalties import Penalty, penalise
from specmesh.lossless.sampling import SamplingParams, argmax, probs_from_logits, sample
from specmesh.lossless.token_tree import TokenTree


@dataclass
class Verdict:
    path: list[int]             # accepted node indices, root first
    tokens: list[int]           # emitted tokens: the accepted drafted ones, then next_token
    next_token: int | None      # the target's token after the last accepted node (None: no logits there)

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def accepts(p_x: float, q_x: float, u: float) -> bool:
    """Rejection-sampling test: accept x with probability min(1, p(x) / q(x))."""
    return u * q_x < p_x


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); p itself when nothing is left (then p == q and nothing is ever rejected)."""
    r = (p - q).clamp_(min=0)
    total = r.sum()
    return r / total if total > 0 else p


def verify(tree: TokenTree, logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None = None, penalty: Penalty | None = None) -> Verdict:
    """logits [N, V] at every node, or [n < N, V] at the first n (the rest are not processed yet)."""
    logits = penalise(penalty, logits, tree)
    if params.greedy:
        return _walk(tree, len(logits), argmax(logits).tolist().__getitem__)
    probs = probs_from_logits(logits, params)                   # [n, V]
    if tree.sampled:
        return _rejection_walk(tree, probs, generator)
    return _walk(tree, len(probs), lambda node: int(sample(probs[node], generator)))


def _unprocessed(tree: TokenTree, path: list[int]) -> Verdict:
    """The walk reached a node without logits: its path is accepted, with no next token."""
    return Verdict(path, [tree.tokens[i] for i in path[1:]], None)


def _walk(tree: TokenTree, processed: int, target_token) -> Verdict:
    """Follow the child holding the target's token at each node (greedy or deterministic proposals)."""
    node, path = 0, [0]
    while True:
        if node >= processed:
            return _unprocessed(tree, path)
        x = target_token(node)
        child = next((c for c in tree.children(node) if tree.tokens[c] == x), None)
        if child is None:
            return Verdict(path, [tree.tokens[i] for i in path[1:]] + [x], x)
        node = child
        path.append(node)


def _rejection_walk(tree: TokenTree, probs: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    node, path = 0, [0]
    while True:
        if node >= len(probs):
            return _unprocessed(tree, path)
        p = probs[node]
        chosen = None
        for child in tree.children(node):
            x, q = tree.tokens[child], tree.q[node]
            u = float(torch.rand((), generator=generator, device=p.device))
            if accepts(float(p[x]), float(q[x]), u):
                chosen = child
                break
            p = residual(p, q)
        if chosen is None:
            x = int(sample(p, generator))
            return Verdict(path, [tree.tokens[i] for i in path[1:]] + [x], x)
        node = chosen
        path.append(node)
