"""PyTorch ops dispatched per draft step (on a host-bound GPU each is a dispatch, most a kernel launch), exact tree
drafting against easyspec's groups, on the PyTorch path (this CPU's kernels off), counted on the CPU:
    python docs/results/2026-11-27-draft-ops.py tree
    python docs/results/2026-11-27-draft-ops.py easyspec 2,2
The embedded pair, float32, the first 4 held-out stdlib prompts, 64 new tokens, greedy; `tree` grows the same
full tree as easyspec (min_prob 0, no lookup). Counts are exact (no timing): ops inside the draft's forwards and
outside them (the tree's bookkeeping), per proposal."""
import collections
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specmesh.model.loader as loader
from specmesh import LLM, SamplingParams
from specmesh.model.model import Transformer
from specmesh.proposers.draft_model import DraftModel

loader.select_kernels = lambda model, draft=False: model          # the PyTorch path, as on a GPU
counts, inside, steps = collections.Counter(), [0], [0]


class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counts["in forwards" if inside[0] else "outside"] += 1
        return func(*args, **(kwargs or {}))


def counted(cls, name: str, forward: bool = False):
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        if forward:
            inside[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                inside[0] -= 1
        steps[0] += name == "propose"
        with Count():
            return original(self, *args, **kwargs)
    setattr(cls, name, wrapper)


counted(DraftModel, "propose"), counted(DraftModel, "accept"), counted(Transformer, "forward", forward=True)
method = sys.argv[1]
options = {"min_prob": 0.0, "lookup": 0} if method == "tree" else {"layer_groups": sys.argv[2]}
llm = LLM(target="embedded", method=method, **options)
with open("prompts/stdlib-heldout.jsonl") as f:
    prompts = [json.loads(line)["prompt"] for line in f][:4]
for prompt in prompts:
    llm.generate(prompt, SamplingParams(max_new_tokens=64))
total = counts["in forwards"] + counts["outside"]
print(f"{' '.join(sys.argv[1:])}: {steps[0]} proposals, ops per proposal {total / steps[0]:.0f} "
      f"(in the draft's forwards {counts['in forwards'] / steps[0]:.0f}, outside {counts['outside'] / steps[0]:.0f})")
