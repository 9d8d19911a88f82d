"""Measuring on this machine: a forward's time, and running with a given torch thread count."""
from __future__ import annotations

import os
import statistics
import time
import warnings
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager

import torch

from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch


@contextmanager
def torch_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


CHOSEN: list[int] = []      # thread counts the user chose (NAME@Nt, --threads), innermost last


@contextmanager
def chosen_threads(n: int):
    """torch_threads(n) as the user asked: the multi-process methods keep it (rank_threads)."""
    CHOSEN.append(n)
    try:
        with torch_threads(n):
            yield
    finally:
        CHOSEN.pop()


def share_of_cores(processes: int) -> int:
    """Threads for one of `processes` processes that compute at once on this machine's cores."""
    return max(1, len(os.sched_getaffinity(0)) // processes)


@contextmanager
def rank_threads(processes: int):
    """Rank 0 of a method of `processes` processes, each computing while the others do: its share of the
    cores (the other ranks take theirs), unless the user chose a count; a warning when that count leaves the
    ranks more threads than cores (each waits for the core another computes on)."""
    cores, share = len(os.sched_getaffinity(0)), share_of_cores(processes)
    if CHOSEN:
        if CHOSEN[-1] + (processes - 1) * share > cores:
            warnings.warn(f"{CHOSEN[-1]} threads here and {share} in each of {processes - 1} other processes "
                          f"oversubscribe {cores} cores: every rank will wait for a core")
        yield
        return
    with torch_threads(share):
        yield


PAUSE_S = 0.3       # between runs that should not all fall in one of a shared machine's slow spells


def pause_then(run):
    """run() after PAUSE_S: repeated runs spread over a shared machine's slow and quiet spells, whose fastest then
    tells what the machine does undisturbed."""
    time.sleep(PAUSE_S)
    return run()


def median_ms(step, reps: int = 20, warmup: int = 3) -> float:
    """Median wall time in ms of `step()` over `reps` runs, after `warmup` untimed ones."""
    times = []
    for _ in range(warmup + reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times[warmup:])[reps // 2] * 1e3


def tree_batch(tokens: int, children: int, layers: range | None = None) -> Batch:
    """A forward of `tokens` tree nodes, each node's parent the one `children` places before it in level order
    (a static tree of `children` children a node), seeing only its ancestors."""
    from specmesh.lossless.token_tree import TokenTree
    tree = TokenTree.root(0)
    for i in range(1, tokens):
        tree.add(0, (i - 1) // children)
    return Batch(depths=tree.depth_tensor(), tree_mask=tree.ancestor_mask(), layers=layers)


def forward_ms(model, tokens: int = 1, context: int = 128, reps: int = 20, layers: range | None = None,
               tree: int = 0) -> float:
    """Median time in ms of a forward of `tokens` new tokens after `context` cached ones through
    `layers` (default: all; random ids or hidden states, fixed seed; three untimed warm-ups); `tree`: the
    tokens are the nodes of a tree of that many children a node (tree_batch), else a chain."""
    layers = layers or range(model.config.num_layers)
    batch = tree_batch(tokens, tree, layers) if tree else Batch(layers=layers)
    gen = torch.Generator().manual_seed(0)
    if layers.start == 0:
        x = torch.randint(model.config.vocab_size, (1, context + tokens), generator=gen)
    else:
        x = torch.randn(1, context + tokens, model.config.hidden_size, generator=gen).to(model.dtype)
    x = x.to(model.device)
    cache = KVCache.for_model(model, 1, context + tokens, layers)

    def step():
        cache.rollback(0, context)
        model(x[:, context:], cache, batch)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)

    with torch.inference_mode():
        model(x[:, :context], cache, Batch(layers=layers))
        cache.commit_all()
        return median_ms(step, reps)


def widths_ms(model, widths: tuple[int, ...], context: int = 128, reps: int = 5) -> dict[int, float]:
    """Median time in ms of a forward at each width, after one prefill of `context` random tokens shared by all (one
    warm-up each). The widths take turns, rep by rep, so a machine whose speed drifts while they are measured slows
    them alike and their ratios hold."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(model.config.vocab_size, (1, context + max(widths)), generator=gen).to(model.device)
    cache = KVCache.for_model(model, 1, context + max(widths))

    def step(w: int) -> float:
        start = time.perf_counter()
        cache.rollback(0, context)
        model(x[:, context:context + w], cache)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        return time.perf_counter() - start

    with torch.inference_mode():
        model(x[:, :context], cache)
        cache.commit_all()
        for w in widths:
            step(w)
        times = {w: [] for w in widths}
        for _ in range(reps):
            for w in widths:
                times[w].append(step(w))
    return {w: sorted(t)[reps // 2] * 1e3 for w, t in times.items()}


def layer_ms(model, tokens: int = 1, context: int = 128, reps: int = 20, tree: int = 0) -> float:
    """A middle decoder layer's forward time in ms (every layer costs the same)."""
    L = model.config.num_layers
    return forward_ms(model, tokens, context, reps, layers=range(L // 2, L // 2 + 1), tree=tree)


def layer_and_head_ms(model, tokens: int = 1, context: int = 128, reps: int = 20,
                      tree: int = 0) -> tuple[float, float]:
    """What a pipeline stage's time is made of: a layer's, and the final norm and LM head's (the last
    layer's forward with them, less a layer's), in ms; `tree`: of tree nodes (forward_ms). A layer's is its
    share of a pass through them all, not of one layer run again and again: a stage streams its layers' weights,
    which a cache that holds one layer's hides."""
    L = model.config.num_layers
    head = max(0.0, forward_ms(model, tokens, context, reps, range(L - 1, L), tree)
               - layer_ms(model, tokens, context, reps, tree))
    return max(0.0, forward_ms(model, tokens, context, reps, range(L), tree) - head) / L, head


def copy_bandwidth_gb_s(mb: int = 256, reps: int = 7, device: torch.device | str = "cpu") -> float:
    """Memory bandwidth of `device` (on the CPU: of this process's threads): the fastest of `reps` copies of `mb`
    MB (the bound is what the machine can do; slower copies met a busy moment), counting the bytes read and the
    bytes written."""
    src = torch.ones(mb << 18, device=device)   # float32: mb MB
    dst = torch.empty_like(src)
    dst.copy_(src)                              # pages in place before timing
    sync = torch.cuda.synchronize if src.is_cuda else (lambda: None)
    best = float("inf")
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step of a loaded model reads: its linears' weights as the kernels hold them
    (packed, quantized: with their scales), the head included; the embedding's one row and the norms left out."""
    total = 0
    lookups = {id(m.table) for m in model.modules() if hasattr(m, "table")} - {id(getattr(model, "lm_head", None))}
    for m in model.modules():
        if isinstance(getattr(m, "nbytes", None), int):          # a GGUF file's matrix (kernels.GGUFLinear)
            total += 0 if id(m) in lookups else m.nbytes
        elif hasattr(m, "in_features") and isinstance(getattr(m, "weight", None), torch.Tensor):
            total += sum(t.numel() * t.element_size() for t in (m.weight, getattr(m, "scale", None))
                         if isinstance(t, torch.Tensor))
    return total


def by_width(measured: dict[int, float]) -> Callable[[int], float]:
    """A target's forward time for any width, linear between the measured widths (flat past the ends)."""
    widths = sorted(measured)

    def ms(w: int) -> float:
        lo = max([x for x in widths if x <= w], default=widths[0])
        hi = min([x for x in widths if x >= w], default=widths[-1])
        if lo == hi:
            return measured[lo]
        return measured[lo] + (measured[hi] - measured[lo]) * (w - lo) / (hi - lo)
    return ms


class WidthCost:
    """A target forward's time by width (tokens over the batch's rows), as the steps it is shown measured it, read as a
    line a + b * width around a given width: `per_token(near)` = b / a, what one more token adds to a forward there,
    as a fraction of the forward's fixed part (weights read once, a step's overheads). The line is fitted to the widths
    seen, those nearer `near` weighing more (past the widths where the weights' reads dominate, each token costs
    more); a width's time is the median of its last STEPS steps (a step the machine stalled must not price a width
    out), its first step not counted (it warms that shape up). `fixed`: that fraction given, not measured. Until
    two widths were seen: PRIOR."""
    PRIOR = 0.1
    STEPS = 9
    BOUNDS = (0.001, 2.0)

    def __init__(self, fixed: float = 0.0):
        self.fixed = fixed
        self.seen: dict[int, deque[float]] = {}         # width -> its last steps' ms
        self.median: dict[int, float] = {}              # width -> their median (widths with a step counted)

    def observe(self, width: int, seconds: float) -> None:
        if width not in self.seen:
            self.seen[width] = deque(maxlen=self.STEPS)
            return
        self.seen[width].append(seconds * 1e3)
        self.median[width] = statistics.median(self.seen[width])

    def per_token(self, near: int = 1) -> float:
        if self.fixed:
            return self.fixed
        if len(self.median) < 2:
            return self.PRIOR
        reach = max(2.0, float(near))                   # a width `near` away from it weighs half
        seen = [(w, y, len(self.seen[w]) / (1 + ((w - near) / reach) ** 2)) for w, y in self.median.items()]
        total = sum(c for _, _, c in seen)              # weighted least squares
        mx, my = sum(c * w for w, _, c in seen) / total, sum(c * y for _, y, c in seen) / total
        b = sum(c * (w - mx) * (y - my) for w, y, c in seen) / sum(c * (w - mx) ** 2 for w, _, c in seen)
        a = my - b * mx
        return min(max(b / a, self.BOUNDS[0]), self.BOUNDS[1]) if a > 0 else self.BOUNDS[1]
