"""Penalties and logit bias: a request's target distribution depends on what it has generated.

For the target's logits z at a position whose context holds the prompt P and the generated tokens G
(the tokens emitted so far, then, inside a proposal, the drafted path down to the node):

  z[t] <- z[t] / r if z[t] > 0 else z[t] * r,  for t in P ∪ G      repetition_penalty r (CTRL; HF, vLLM)
  z[t] <- z[t] - f * count_G(t) - p * [count_G(t) > 0]             frequency f, presence p (OpenAI)
  z[t] <- z[t] + bias[t]                                            logit_bias

then temperature, top-k and top-p as always. Verification applies this at every node of a tree with
that node's own path in G, so a speculative method samples exactly from the penalised target, and
greedy equals `ar` with the same penalties; a draft may apply it too, only to propose better.
"""
from __future__ import annotations

import torch

from specmesh.lossless.sampling import SamplingParams
from specmesh.lossless.token_tree import TokenTree


class Penalty:
    """One sequence's penalties, over its prompt and its token list (appended to in place)."""

    def __init__(self, params: SamplingParams, prompt: list[int], generated: list[int]):
        self.params, self.prompt, self.generated = params, prompt, generated
        self.counts: torch.Tensor | None = None         # [V] how often each token was generated
        self.in_prompt: torch.Tensor | None = None      # [V] bool
        self.counted: list[int] = []                    # the generated tokens in counts

    def apply(self, logits: torch.Tensor, tree: TokenTree | None = None, nodes: list[int] | None = None
              ) -> torch.Tensor:
        """logits [n, V] -> penalised float32 logits [n, V]. Without a tree: every row follows the generated
        tokens. With one: row i follows tree node nodes[i] (default i), whose path below the root (the
        newest generated token) counts as generated."""
        z = logits.float()
        n, V = z.shape
        counts = self._counts(V, z.device).expand(n, V)
        if tree is not None:
            counts = counts + self._path_counts(tree, range(n) if nodes is None else nodes, V, z.device)
        p = self.params
        if p.repetition_penalty != 1:
            seen = (counts > 0) | self.in_prompt
            r = p.repetition_penalty
            z = torch.where(seen, torch.where(z > 0, z / r, z * r), z)
        if p.frequency_penalty:
            z = z - p.frequency_penalty * counts
        if p.presence_penalty:
            z = z - p.presence_penalty * (counts > 0).float()
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=z.device)
            bias = torch.tensor(list(p.logit_bias.values()), dtype=z.dtype, device=z.device)
            z = z.index_add(1, ids, bias.expand(n, -1))
        return z

    def _counts(self, V: int, device: torch.device) -> torch.Tensor:
        """Counts of the generated tokens [V], brought up to date (recounted if the list was cut meanwhile)."""
        k = len(self.counted)
        if self.counts is None or self.counts.device != device or self.generated[:k] != self.counted:
            self.counts = torch.zeros(V, device=device)
            self.in_prompt = torch.zeros(V, dtype=torch.bool, device=device)
            self.in_prompt[torch.tensor(self.prompt, device=device)] = True
            self.counted, k = [], 0
        if k < len(self.generated):
            new = self.generated[k:]
            self.counts.index_add_(0, torch.tensor(new, device=device), torch.ones(len(new), device=device))
            self.counted += new
        return self.counts

    @staticmethod
    def _path_counts(tree: TokenTree, nodes, V: int, device: torch.device) -> torch.Tensor:
        """[n, V]: row i counts the tokens on the path from below the root down to nodes[i]."""
        rows, cols = [], []
        for i, node in enumerate(nodes):
            for anc in tree.path_to(node)[1:]:
                rows.append(i)
                cols.append(tree.tokens[anc])
        extra = torch.zeros(len(nodes), V, device=device)
        if rows:
            extra.index_put_((torch.tensor(rows, device=device), torch.tensor(cols, device=device)),
                             torch.ones(len(rows), device=device), accumulate=True)
        return extra


def penalty_for(params: SamplingParams, prompt: list[int], generated: list[int]) -> Penalty | None:
    """The request's Penalty over its prompt and its token list, or None where it asked for none."""
    return Penalty(params, prompt, generated) if params.penalties else None


def penalise(penalty: Penalty | None, logits: torch.Tensor, tree: TokenTree | None = None,
             nodes: list[int] | None = None) -> torch.Tensor:
    """`penalty.apply`, or the logits as they are when the request asked for none."""
    return logits if penalty is None else penalty.apply(logits, tree, nodes)
