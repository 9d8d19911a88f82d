"""Pipeline-parallel runtime: the target split into stages of contiguous layers, one process each.

Stage k holds `stage_layers(...)[k]`: stage 0 also the embedding, the last stage the
final norm and the LM head, and with it the only logits: tokens are decided there, with
the request's sampling parameters and seed. Rank 0 runs the decode loop and stage 0: for
`pipedec` and `stpp` it is also the draft S ("draft+stage0"), unless S runs apart, when rank 0
is S only and the stages are ranks 1..n.

A packet goes from each rank to the next (S -> stage 0 -> stage 1 -> ...):
  header int64 [2]: T new tokens (-1: the request is over) and C, the tree-mask columns
    (-1: a chain after the tokens held: the prompt, pp's tokens);
  meta int64 [T, 3 + C]: token, depth below the committed prefix, parent node (stpp;
    -1 in PipeDec layers), then the mask row over the C = held + T speculative slots
    (sent for trees, and to stage 0, which needs the tokens);
  hidden states float32 [1, T, D] (to stages after the first).
A chain's tokens are committed at once; tree nodes stay speculative (PipeDec's
"predict" cache beside the "past") until a decision.

Tree methods: every decision is made once, by the last stage, and sent to S and every
other stage as int64 [3 + K]: kind, token, count, nodes. START (the prompt's token),
NONE (nothing finished this timestep), HIT (pipedec: the token is the root's child
`nodes[0]`: the root becomes committed and that child's subtree stays), MISS (the root
becomes committed and all else is dropped) or COMMIT (stpp: the accepted path `nodes`
becomes committed). Each rank applies it to what it holds, so ranks cannot diverge.
"""
from __future__ import annotations

import atexit
import functools
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.runtime import PeerError
from specmesh.runtime.link import Link, connect, lending_wanted, under_torchrun
from specmesh.timing import rank_threads, share_of_cores

START, NONE, HIT, MISS, COMMIT = range(5)
END = -1                                    # header T: the request is over


def roles(stages: int, draft: bool = False, apart: bool = False) -> list[str]:
    """Rank 0 first: stage 0, S sharing stage 0's process ("draft+stage0"), or S apart."""
    names = [f"stage{i}" for i in range(stages)]
    if draft:
        names = ["draft"] + names if apart else ["draft+stage0"] + names[1:]
    return names


def stage_layers(num_layers: int, stages: int, method: str | None = None) -> list[range]:
    """Contiguous layer ranges, as even as possible (earlier stages take the extra layers)."""
    check_stages(num_layers, stages, method)
    base, extra = divmod(num_layers, stages)
    return ranges([base + (i < extra) for i in range(stages)])


def balanced_layers(num_layers: int, stages: int, first_ms: float, wide_ms: float, root_ms: float,
                    head_ms: float, method: str | None = None) -> list[range]:
    """PipeDec's split: in its steady state stage 0 (plus `first_ms` of S's work when S shares
    its process) and the middle stages process a tree layer (`wide_ms` per target layer),
    while the last stage processes the root (`root_ms` per layer, plus the head). The split
    that minimises the slowest stage; middle stages share their layers evenly."""
    check_stages(num_layers, stages, method)
    if stages == 1:
        return ranges([num_layers])
    best = None
    for first in range(1, num_layers - stages + 2):
        for last in range(1, num_layers - first - (stages - 2) + 1):
            middle, left = stages - 2, num_layers - first - last
            if (middle == 0) != (left == 0):
                continue
            base, extra = divmod(left, middle) if middle else (0, 0)
            counts = [first] + [base + (i < extra) for i in range(middle)] + [last]
            slowest = max(first_ms + first * wide_ms, (base + (extra > 0)) * wide_ms, head_ms + last * root_ms)
            if best is None or slowest < best[0] - 1e-9:
                best = (slowest, counts)
    return ranges(best[1])


def check_stages(num_layers: int, stages: int, method: str | None = None) -> None:
    """A clear error before any process starts (a pipeline method needs two stages or more)."""
    if method is not None and stages < 2:
        raise ValueError(f"{method} needs at least 2 stages (1 stage is {'`ar`' if method == 'pp' else '`tree`'})")
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {stages} stages (1 to {num_layers})")


def ranges(counts: list[int]) -> list[range]:
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def stage_seed(generator: torch.Generator) -> int:
    """The seed of the last stage's sampler, drawn from the job's generator."""
    return int(torch.randint(2 ** 62, (), generator=generator, device=generator.device))


def tree_meta(tokens: torch.Tensor, depths: torch.Tensor, parents: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """meta [T, 3 + C] from tokens, depths, parents [T] and the mask rows [T, C]."""
    return torch.cat([torch.stack([tokens, depths, parents], 1).long().cpu(), mask.long().cpu()], 1)


@dataclass
class Decision:
    kind: int
    token: int = -1
    nodes: list[int] = field(default_factory=list)

    def encode(self, size: int) -> torch.Tensor:
        message = torch.zeros(size, dtype=torch.int64)
        message[:3 + len(self.nodes)] = torch.tensor([self.kind, self.token, len(self.nodes)] + self.nodes)
        return message

    @classmethod
    def decode(cls, message: torch.Tensor) -> "Decision":
        kind, token, count, *nodes = message.tolist()
        return cls(kind, token, nodes[:count])


@dataclass
class Packet:
    """T new tokens for a stage: `x` ids [1, T] (stage 0) or hidden states [1, T, D]; `meta`
    [T, 3 + C] for tree nodes, None for a chain."""
    x: torch.Tensor | None = None
    meta: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return 0 if self.x is None else self.x.shape[1]

    def subtree(self, node: int, held: torch.Tensor) -> "Packet":
        """After a hit on `node`: the rows in its subtree, their mask columns restricted to the
        kept nodes (`held`: which of the receiver's held slots stay), one level shallower."""
        rows = self.meta[:, 3 + node].bool()                                  # [T]
        if not rows.any():
            return Packet()
        cols = torch.cat([torch.ones(3, dtype=torch.bool), held, rows])
        meta = self.meta[rows][:, cols]
        meta[:, 1] -= 1
        return Packet(self.x[:, rows], meta)


class Stage:
    """One stage's model part, cache and links (any rank). `first`: the rank of stage 0.

    `held` [S, S] is the ancestor mask of the S speculative (predict) slots, slot i = tree
    node i: a hit keeps the slots in the hit node's subtree."""

    def __init__(self, model, link: Link, first: int = 0):
        self.model, self.link = model, link
        self.index, self.count = link.rank - first, len(link.roles) - first
        self.last = self.index == self.count - 1
        self.layers, self.pipelined, self.held_out = range(0), False, None
        self.cache: KVCache | None = None
        self.held = torch.zeros(0, 0, dtype=torch.bool)

    def begin(self, max_len: int, layers: range, pipelined: bool = False) -> None:
        self.layers, self.pipelined = layers, pipelined
        self.cache = KVCache.for_model(self.model, 1, max_len, layers)
        self.held = torch.zeros(0, 0, dtype=torch.bool)
        self.held_out = Packet() if pipelined and self.index + 2 < self.count else None   # output for the next timestep

    def forward(self, packet: Packet) -> torch.Tensor:
        """Hidden states [1, T, D], or logits on the last stage (a chain's last position only)."""
        tree = {}
        if packet.meta is not None:
            mask = packet.meta[:, 3:].bool()
            S = len(self.held)
            if mask.shape[1] != S + packet.size:
                raise RuntimeError(f"stage {self.index} is out of step: a tree packet over {mask.shape[1]} slots "
                                   f"arrived while it holds {S} + {packet.size}")
            tree = {"depths": packet.meta[:, 1], "tree_mask": mask}      # on the host, where the cache reads them
        out = self.model(packet.x.to(self.model.device), self.cache,
                         Batch(layers=self.layers, last_only=self.last and not tree, **tree))
        if tree:
            held = torch.zeros(len(mask[0]), len(mask[0]), dtype=torch.bool)
            held[:S, :S], held[S:] = self.held, mask
            self.held = held
        else:
            self.cache.commit_all()
        return out

    def settle(self, decision: Decision, packet: Packet, in_flight: bool) -> Packet:
        """Apply a decision to the cache and, when `in_flight` (sent before the decision), to
        `packet`; returns the packet to process."""
        kind, nodes = decision.kind, decision.nodes
        if kind in (START, NONE):
            return packet
        held, self.held = self.held, torch.zeros(0, 0, dtype=torch.bool)
        if kind == COMMIT:
            self.cache.commit(0, nodes)
            return packet
        if kind == MISS:
            self.cache.commit(0, [0])
            return Packet() if in_flight else packet
        node = nodes[0]                                                       # HIT
        keep = held[:, node] if node < len(held) else torch.zeros(len(held), dtype=torch.bool)
        self.cache.commit(0, [0], keep.nonzero().flatten().tolist())
        self.held = held[keep][:, keep]
        return packet.subtree(node, keep) if in_flight and packet.size else packet

    def advance(self, packet: Packet, decision: Decision, in_flight: bool) -> list:
        """One timestep of a tree method: apply the decision, process the packet, send the output on
        (returns the sends' waits). In PipeDec a layer reaches the next stage a timestep later,
        pruned there by the decision taken meanwhile, except at the last stage, which decides
        at the end of this timestep on what the stage before it processed now: an output for a
        middle stage is held and sent at the start of the next timestep (an empty one first)."""
        sending = []
        if self.held_out is not None:
            sending += self.send_on(self.held_out, wait=False)
        packet = self.settle(decision, packet, in_flight)
        out = Packet(self.forward(packet), packet.meta) if packet.size else Packet()
        if self.pipelined and self.index + 2 < self.count:
            self.held_out = out
        else:
            sending += self.send_on(out, wait=False)
        return sending

    def send_on(self, packet: Packet, wait: bool = True) -> list:
        """Send `packet` to the next stage (`wait=False`: returns the sends' waits)."""
        link, dst = self.link, self.link.rank + 1
        T, C = packet.size, -1 if packet.meta is None else packet.meta.shape[1] - 3
        parts = [torch.tensor([T, C])] + ([packet.meta] if T and C >= 0 else []) + \
            ([packet.x.float().cpu()] if T else [])
        return [link.send(part, dst, wait) for part in parts]

    def receive(self) -> Packet | None:
        """The previous rank's packet (maybe empty), or None when the request is over."""
        link, src = self.link, self.link.rank - 1
        T, C = link.recv(torch.zeros(2, dtype=torch.int64), src).tolist()
        if T == END:
            return None
        if T == 0:
            return Packet()
        meta = link.recv(torch.zeros(T, 3 + max(C, 0), dtype=torch.int64), src) if C >= 0 or self.index == 0 \
            else None
        if self.index == 0:
            return Packet(meta[:, :1].T.contiguous(), meta if C >= 0 else None)
        hidden = link.recv(torch.zeros(1, T, self.model.config.hidden_size), src).to(self.model.dtype)
        return Packet(hidden, meta if C >= 0 else None)

    def end(self) -> None:
        if not self.last:
            self.link.send(torch.tensor([END, -1]), self.link.rank + 1)


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C held during a job, raised where the stages are in step (Pipeline.checkpoint)."""


class HeldInterrupt:
    """SIGINT while installed: noted (`came`), not raised; a second one is raised at once (KeyboardInterrupt)."""

    def __init__(self):
        self.came = False

    def __call__(self, signum, frame):
        if self.came:
            signal.default_int_handler(signum, frame)
        self.came = True
        print("specmesh: stopping at the end of this step (Ctrl-C again: at once, and the pipeline starts again)",
              file=sys.stderr, flush=True)


@contextmanager
def held_interrupt():
    """A HeldInterrupt as SIGINT's handler for the block, where SIGINT is Python's KeyboardInterrupt (the main
    thread, no handler of the program's own, as the server's); elsewhere one that never comes."""
    held = HeldInterrupt()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield held
        return
    before = signal.signal(signal.SIGINT, held)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, before)


class Pipeline:
    """Rank 0's handle on the stages. Rank 0 runs stage 0 itself (pp; pipedec and stpp with S
    in the same process: one process per core on a small machine), or only S (`apart`,
    when S has a device of its own), the stages then being ranks 1..n."""

    def __init__(self, link: Link, stage: Stage | None, split: list[range]):
        self.link, self.stage, self.split = link, stage, split
        self.max_nodes = 0
        self.latest = Decision(NONE)            # the last decision, for rank 0's own stage to apply
        self.sending: list = []                 # sends not known to be received yet
        self.broken = False                     # a job failed midway: the stages may be out of step
        self.interrupted = False                # ... while every rank still answered: start the stages again
        self.relaunch: Callable[[], Link] | None = None     # the stages started anew (launched here), or None
        self.interrupt = HeldInterrupt()        # this job's Ctrl-C (running)
        atexit.register(self.close)

    @classmethod
    def start(cls, models, dtype: torch.dtype, split: list[range], timeout: float, serve: str, draft: bool = False,
              apart: bool = False) -> "Pipeline":
        """Start the stage processes, each running `serve` ("module:Class": what a stage computes, which
        the method supplies); with a `draft` (models.draft), rank 0 is S too."""
        target = models.target
        config = {"serve": serve, "target": str(models.target_path),
                  "dtype": str(dtype).split(".")[-1], "quant": target.quant, "device": str(target.device),
                  "timeout": timeout, "threads": share_of_cores(len(split) + apart)}
        # a stage computes on the cores of the ranks that wait
        launch = functools.partial(connect, roles(len(split), draft, apart), config, timeout, lend=lending_wanted())
        link = launch()
        pipe = cls(link, None if apart else Stage(target, link), split)
        pipe.relaunch = None if under_torchrun() else launch        # torchrun's ranks are not this process's to start
        return pipe

    @contextmanager
    def running(self, finish):
        """Around a job's decode loop, this rank on its share of the cores (rank_threads): `finish()` when the
        consumer stops it (GeneratorExit) or Ctrl-C stops it (held until the loop's next `checkpoint`, where the
        stages are in step); after any other failure the stages are out of step, so close() will not talk to
        them, and where no peer was lost (a second Ctrl-C, an error of this rank's own) the next job starts
        them again (`recover`)."""
        try:
            with rank_threads(len(self.link.roles)), self.link.lending(), held_interrupt() as self.interrupt:
                yield
        except (GeneratorExit, Interrupted):
            finish()
            raise
        except BaseException as e:
            self.broken, self.interrupted = True, not isinstance(e, PeerError)
            raise

    def checkpoint(self) -> None:
        """Where the decode loop yields (every rank in step): a Ctrl-C held since ends the job here."""
        if self.interrupt.came:
            raise Interrupted

    def recover(self) -> None:
        """The stages started anew after an interrupted job left them mid-round; under torchrun, whose ranks this
        process cannot start, a PeerError saying so at once."""
        if self.relaunch is None:
            raise PeerError("the pipeline's ranks are out of step after an interrupted request, and torchrun's "
                            "ranks cannot be started again from here: start the job again")
        self.link.shutdown(healthy=False)
        self.link = self.relaunch()
        if self.stage is not None:
            self.stage = Stage(self.stage.model, self.link)
        self.broken = self.interrupted = False
        self.sending, self.latest = [], Decision(NONE)

    def begin(self, job: dict, max_len: int, pipelined: bool, max_nodes: int = 0,
              split: list[range] | None = None) -> None:
        """Send a job to every stage rank (and begin rank 0's own stage): `job` is the method's (what its
        stage servers read), plus `max_len` cache slots, `max_nodes` (the size of a decision) and `split`,
        its layers per stage (default: the pipeline's); `pipelined`: a layer reaches the next stage a
        timestep later (stage.advance)."""
        if self.interrupted:
            self.recover()
        self.max_nodes, self.latest = max_nodes, Decision(NONE)
        split = split or self.split
        message = job | {"max_len": max_len, "max_nodes": max_nodes, "pipelined": pipelined,
                         "layers": [(r.start, r.stop) for r in split]}
        for rank in range(1, len(self.link.roles)):
            self.link.send_obj(message, rank)
        if self.stage is not None:
            self.stage.begin(max_len, split[0], pipelined)

    # -- S, for pipedec and stpp ----------------------------------------------------------------
    def send(self, tokens: list[int] | None = None, meta: torch.Tensor | None = None) -> None:
        """A chain of `tokens` or the tree nodes of `meta` into stage 0 (returns once it is on its way)."""
        C = -1 if meta is None else meta.shape[1] - 3
        meta = torch.tensor(tokens)[:, None].repeat(1, 3) if meta is None else meta
        if self.stage is None:
            self.sending += [self.link.send(torch.tensor([len(meta), C]), 1, wait=False),
                             self.link.send(meta, 1, wait=False)]
            return
        packet = Packet(meta[:, :1].T.contiguous(), meta if C >= 0 else None)
        if C < 0:                                       # the prompt
            self.sending += self.stage.send_on(Packet(self.stage.forward(packet)), wait=False)
        else:
            self.sending += self.stage.advance(packet, self.latest, in_flight=False)

    def decision(self) -> Decision:
        """The last stage's decision on this timestep."""
        message = self.link.recv(torch.zeros(3 + self.max_nodes, dtype=torch.int64), len(self.link.roles) - 1)
        self.flush()
        self.latest = Decision.decode(message)
        return self.latest

    def end(self) -> None:
        """The request is over (the stages pass it on)."""
        self.sending.append(self.link.send(torch.tensor([END, -1]), 1, wait=False))
        self.flush()

    def flush(self) -> None:
        """Wait until the next rank has taken what was sent."""
        for done in self.sending:
            done()
        self.sending = []

    def close(self) -> None:
        if self.link is not None:
            self.link.shutdown(healthy=not self.broken)
            self.link = None
