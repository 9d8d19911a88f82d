"""Tensor-parallel target: one shard per process (model/shard.py), the parts of each attention and MLP output
summed over the ranks (two all-reduces a layer), the logits on rank 0 only. Knows no methods.

Rank 0 runs everything else (the engine, the method, the draft) on a target that looks like any other: its
`fast_forward` is a `Leader`, which sends each forward to the other ranks before computing its own shard,
and its caches are `MirroredCache`s, whose changes (commits, rollbacks, moved rows, saved prompts) are
logged and sent with the next forward, so every rank repeats them in the same order on its own shard.
Ranks 1.. (`Follower`) wait for a forward, apply the logged changes, compute their shard, and repeat.

A method whose draft runs layer-parallel groups (easyspec: MethodSpec.spread_draft) has its draft on every
rank too, whole, led the same way: in a group of g layers rank i < g computes layer i's attention (and its
keys and values) on the group's input, the ranks exchange those, and each runs the group's MLPs in order
(`Group.layer_parallel`, the authors' default policy): the ranks that idle while the draft runs share its
attention. Every rank thus holds the same draft cache, and exact forwards run whole on every rank.

The all-reduce on CPU: every rank sends its part to every other (shared-memory mailboxes on one machine,
gloo between machines, runtime/link.py) and sums the parts in rank order. The sum is the same on every
rank and does not depend on how many rows a forward has, so a token's logits are the same in an `ar`
step and in a verification (the kernels' row invariance, kept: lossless methods stay lossless under
--tp). They differ from one process's by float rounding: the output projections sum over their inputs
in parts. On CUDA the parts are summed by NCCL. A rank that dies or stops answering fails the forward
within the link's timeout with a PeerError naming it.
"""
from __future__ import annotations

import ctypes
import datetime
import os
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch, FastForward
from specmesh.model.kernel_choice import select_kernels
from specmesh.model.loader import DTYPES, load_model
from specmesh.model.model import Transformer
from specmesh.model.shard import drop_head
from specmesh.runtime.link import Link, connect
from specmesh.timing import CHOSEN, share_of_cores

SERVE = f"{__name__}:Follower"
TIMEOUT_S = 60.0                            # a rank waits this long for another within a forward
REDUCE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)     # csrc/avx2.c's Layer.reduce


def roles(world: int) -> list[str]:
    return [f"tp{r}" for r in range(world)]


class Group:
    """This rank's end of the tensor-parallel ranks: the all-reduce of a shard's partial outputs."""

    def __init__(self, link: Link, device: torch.device):
        self.link, self.rank, self.world, self.device = link, link.rank, len(link.roles), device
        self.error: BaseException | None = None         # the first failure: every later forward fails too
        self.c_reduce = REDUCE(self._c_reduce)           # kept alive as long as the kernels may call it
        self.nccl = None
        if device.type == "cuda":
            store = dist.PrefixStore("nccl", link.store)
            self.nccl = dist.ProcessGroupNCCL(store, self.rank, self.world)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's x (same shape on all), the same on every rank."""
        self.check()
        if self.nccl is not None and x.is_cuda:
            try:
                self.nccl.allreduce([x]).wait(datetime.timedelta(seconds=self.link.timeout_s))
            except BaseException as e:
                self.error = e
                raise
            return x
        parts = [part for part, in self.gather([x], [tuple(x.shape)], self.world)]
        total = parts[0].clone()
        for part in parts[1:]:                      # in rank order: the same sum on every rank
            total += part
        return total.to(x.dtype)

    def _c_reduce(self, address: int, n: int) -> None:
        """The kernels' callback: x[n] float32 at `address` <- the sum over the ranks. An exception cannot
        cross into C: it is kept, the rest of the forward computes without the others, and `check` raises it."""
        if self.error is not None:
            return
        try:
            x = torch.frombuffer((ctypes.c_float * n).from_address(address), dtype=torch.float32)
            x.copy_(self.all_reduce(x))
        except BaseException:
            pass                                    # kept in self.error

    def layer_parallel(self, blocks: list, h: torch.Tensor, cos, sin, cache: KVCache, mask) -> torch.Tensor:
        """model.layer_parallel with the group's attentions spread over the ranks: rank i computes block i's
        (and i + N's, ... in a group larger than the N ranks) on the group's input, writing its cache entries;
        the ranks exchange outputs and new keys and values; then every rank writes them and runs the MLPs in
        order. [B,T,D] -> [B,T,D], the same on every rank."""
        parts = [getattr(b, "block", b) for b in blocks]       # kernels wrap a Block (model/c_forward.py)
        B, T, D = h.shape
        kv = (B, parts[0].attn.hkv, T, parts[0].attn.hd)
        outs = []
        for first in range(0, len(parts), self.world):
            chunk, mine = parts[first:first + self.world], []
            if self.rank < len(chunk):
                p = chunk[self.rank]
                mine = [p.attn(p.attn_norm(h), cos, sin, cache, mask), *cache.written(p.attn.layer, T)]
            for i, (p, (out, k, v)) in enumerate(zip(chunk, self.gather(mine, [(B, T, D), kv, kv], len(chunk)))):
                if i != self.rank:                                  # the other ranks' keys and values
                    cache.write(p.attn.layer, k.to(cache.k[0].dtype), v.to(cache.k[0].dtype))
                outs.append(out)
        for p, out in zip(parts, outs):
            h = h + p.attn_post_norm(out.to(h.dtype))
            h = h + p.mlp_post_norm(p.mlp(p.mlp_norm(h)))
        return h

    def gather(self, mine: list[torch.Tensor], shapes: list[tuple], senders: int) -> list[list[torch.Tensor]]:
        """Ranks 0..senders-1 each hold tensors of `shapes` (`mine`, empty on the other ranks); every rank gets
        all of them, in rank order (one float32 message from each sender to each other rank)."""
        self.check()
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        own = torch.cat([t.float().cpu().reshape(-1) for t in mine]) if mine else None
        try:
            sending = [] if own is None else \
                [self.link.send(own, r, wait=False) for r in range(self.world) if r != self.rank]
            flat = [own if r == self.rank else self.link.recv(torch.empty(sum(sizes)), r) for r in range(senders)]
            for done in sending:
                done()
        except BaseException as e:
            self.error = e
            raise
        device = mine[0].device if mine else self.device
        return [[t.view(s).to(device) for t, s in zip(f.split(sizes), shapes)] for f in flat]

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def install(self, model: Transformer) -> None:
        """Sum every block's attention and MLP outputs over the ranks, in PyTorch and in the C kernels."""
        model.run_on(replace(model.execution, all_reduce=self.all_reduce,
                             c_reduce=ctypes.cast(self.c_reduce, ctypes.c_void_p).value))


class SavedPrefix(tuple):
    """MirroredCache.prefix()'s copy (k, v): rank 0's shard here, each other rank keeps its own under `handle`
    until this is gone."""

    def __new__(cls, kv, handle: int, leader: "Leader"):
        saved = super().__new__(cls, kv)
        saved.handle, saved.leader = handle, leader
        return saved

    def __del__(self):
        self.leader.pending.append([self.leader.name, -1, 0, 0, "drop", self.handle])


class MirroredCache(KVCache):
    """Rank 0's shard of a cache; each change is logged for the other ranks (Leader.pending), in order."""
    leader: "Leader"
    id: int
    root: bool = False                              # the cache itself, not a view of it

    def _log(self, name: str, *args) -> None:
        self.leader.pending.append([self.leader.name, self.id, self.row0, self.batch, name, *args])

    def view(self, start: int, stop: int) -> "MirroredCache":
        view = super().view(start, stop)
        view.leader, view.id, view.root = self.leader, self.id, False
        return view

    def commit(self, row, path, keep=()) -> None:
        super().commit(row, path, keep)
        self._log("commit", row, [int(i) for i in path], [int(i) for i in keep])

    def commit_all(self, row: int | None = None) -> None:
        super().commit_all(row)
        self._log("commit_all", row)

    def rollback(self, row: int, length: int) -> None:
        super().rollback(row, length)
        self._log("rollback", row, int(length))

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self._log("move_row", src, dst)

    def prefix(self) -> SavedPrefix:
        self.leader.saved += 1
        self._log("prefix", self.leader.saved)
        return SavedPrefix(super().prefix(), self.leader.saved, self.leader)

    def fill_prefix(self, row: int, kv: SavedPrefix) -> None:
        super().fill_prefix(row, kv)
        self._log("fill_prefix", row, kv.handle)

    def __del__(self):
        if self.root:
            self.leader.pending.append([self.leader.name, self.id, 0, 0, "free"])


class ExactOnly(FastForward):
    """A spread draft's fast forward: the kernels' one-call forward for exact forwards; a forward with groups
    takes the model's PyTorch path, whose groups run across the ranks (Group.layer_parallel)."""

    def __init__(self, inner: FastForward | None):
        self.inner = inner

    def __call__(self, x, cache, batch: Batch):
        return None if batch.groups is not None or self.inner is None else self.inner(x, cache, batch)


def spread(model: Transformer, group: Group) -> Transformer:
    """A draft whose layer-parallel groups run across the ranks (every rank holds it whole)."""
    model.run_on(replace(model.execution, fast=ExactOnly(model.fast_forward), layer_parallel=group.layer_parallel))
    return model


class Leader(FastForward):
    """Rank 0's fast_forward and cache maker (KVCache.for_model asks model.tp) for the split target (`name`
    "target") or the spread draft ("draft"): sends each forward, with the cache changes logged since the
    last, to the other ranks, then computes rank 0's part (through the kernels' own fast forward where they
    take it, else the model's PyTorch path)."""

    def __init__(self, name: str, model: Transformer, group: Group):
        self.name, self.model, self.group, self.inner = name, model, group, model.fast_forward
        self.pending: list[list] = []               # cache changes not sent yet
        self.caches = self.saved = 0                 # ids given out
        model.run_on(replace(model.execution, fast=self, split=self))

    @property
    def link(self) -> Link | None:
        return self.group.link

    def cache(self, batch: int, max_len: int, layers: range | None = None) -> MirroredCache:
        cfg = self.model.config
        layers = layers or range(cfg.num_layers)
        cache = MirroredCache(len(layers), batch, max_len, cfg.num_kv_heads, cfg.head_dim, self.model.cache_dtype,
                              self.model.device, layers.start)
        self.caches += 1
        cache.leader, cache.id, cache.root = self, self.caches, True
        self.pending.append([self.name, cache.id, 0, batch, "new", max_len, layers.start, layers.stop])
        return cache

    def __call__(self, x, cache, batch: Batch):
        # lens (a padded batch's real tokens) is a CPU saving only: every rank computes the pads
        groups, layers = batch.groups, batch.span(self.model.config.num_layers)
        message = {"model": self.name, "ops": self.pending, "x": x.tolist(), "layers": [layers.start, layers.stop],
                   "groups": None if groups is None else [[g.start, g.stop] for g in groups],
                   "last_only": batch.last_only, "cache": None if cache is None else [cache.id, cache.row0, cache.batch],
                   "depths": None if batch.depths is None else batch.depths.tolist(),
                   "tree_mask": None if batch.tree_mask is None else batch.tree_mask.int().tolist()}
        self.pending = []
        self.group.check()
        for rank in range(1, self.group.world):
            self.group.link.send_json(message, rank)
        out = None if self.inner is None else self.inner(x, cache, replace(batch, lens=None))
        self.group.check()
        return out

    def close(self) -> None:
        """Tell the other ranks to exit (after a failure: kill them)."""
        link, self.group.link = self.group.link, None
        if link is not None:
            link.shutdown(healthy=self.group.error is None, mailbox=True)


class Follower:
    """Ranks 1..: load this rank's shard of the target (and the whole draft, where it is spread), then repeat
    rank 0's forwards and cache changes until shutdown."""

    def __init__(self, config: dict):
        rank = int(os.environ["RANK"])
        self.device = torch.device(config["device"])
        if self.device.type == "cuda":              # a GPU per rank: torchrun's local rank, else the rank
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        dtype, quant = DTYPES[config["dtype"]], config.get("quant")
        self.models = {"target": load_model(Path(config["target"]), dtype, self.device, quant=quant,
                                            part=(rank, int(config["world"])))}
        if config.get("draft"):
            draft = drop_head(load_model(Path(config["draft"]), dtype, self.device, pack=False, draft=True,
                                         quant=quant))
            self.models["draft"] = select_kernels(draft, draft=True)
        self.caches: dict[tuple[str, int], KVCache] = {}
        self.saved: dict[tuple[str, int], tuple] = {}

    def run(self, link: Link) -> None:
        group = Group(link, self.device)
        group.install(self.models["target"])
        if "draft" in self.models:
            spread(self.models["draft"], group)
        with torch.inference_mode():
            while not (message := link.recv_json(0, idle=True)).get("shutdown"):
                for op in message["ops"]:
                    self.apply(*op)
                self.forward(message)
                group.check()

    def apply(self, model: str, cache_id: int, row0: int, batch: int, name: str, *args) -> None:
        key = (model, cache_id)
        if name == "new":
            self.caches[key] = KVCache.for_model(self.models[model], batch, args[0], range(args[1], args[2]))
        elif name == "free":
            del self.caches[key]
        elif name == "drop":
            self.saved.pop((model, args[0]), None)
        elif name == "prefix":
            self.saved[model, args[0]] = self.view(key, row0, batch).prefix()
        elif name == "fill_prefix":
            self.view(key, row0, batch).fill_prefix(args[0], self.saved[model, args[1]])
        else:
            getattr(self.view(key, row0, batch), name)(*args)

    def view(self, key: tuple[str, int], row0: int, batch: int) -> KVCache:
        cache = self.caches[key]
        return cache if (row0, batch) == (0, cache.batch) else cache.view(row0, row0 + batch)

    def forward(self, message: dict) -> None:
        dev, name = self.device, message["model"]
        tensor = (lambda key, dtype: None if message[key] is None
                  else torch.tensor(message[key], dtype=dtype, device=dev))
        cache = None if message["cache"] is None else self.view((name, message["cache"][0]), *message["cache"][1:])
        groups = None if message["groups"] is None else [range(*g) for g in message["groups"]]
        self.models[name](tensor("x", torch.long), cache, Batch(
            depths=tensor("depths", torch.long), tree_mask=tensor("tree_mask", torch.bool),
            layers=range(*message["layers"]), last_only=message["last_only"], groups=groups))


def start(target: Transformer, path: Path, dtype: torch.dtype, quant: str | None, world: int,
          timeout_s: float = TIMEOUT_S, draft: Transformer | None = None, draft_path: Path | None = None) -> Leader:
    """Make `target` (rank 0's shard, loaded with part=(0, world)) the leader of `world` ranks: the others are
    launched here (or met under torchrun), each loading its shard of `path`; with a `draft`, every rank also
    holds the draft of `draft_path`, its layer-parallel groups spread over them. Without a thread count the
    user chose, each rank computes on its share of the cores."""
    threads = share_of_cores(world)
    config = {"serve": SERVE, "target": str(path), "draft": None if draft is None else str(draft_path),
              "dtype": str(dtype).split(".")[-1], "quant": quant, "device": str(target.device), "world": world,
              "timeout": timeout_s, "threads": CHOSEN[-1] if CHOSEN else threads}
    link = connect(roles(world), config, timeout_s)
    if not CHOSEN:
        torch.set_num_threads(threads)
    group = Group(link, target.device)
    group.install(target)
    if draft is not None:
        Leader("draft", spread(draft, group), group)
    return Leader("target", target, group)
