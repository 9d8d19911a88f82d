"""cosine's drafters in processes of their own (`--drafter-processes`): rank 0 verifies, routes and fuses; rank
n (1..N) holds drafter n, launched here or met under torchrun (runtime/link.py). The drafters draft at the
same time: rank 0 sends each routed drafter its next read, then collects the answers.

Rank 0 sees each one as a `RemoteDrafter` (fused_drafters.Drafter's interface); rank n runs `DrafterServer`,
which keeps a `Drafter` and its draft cache rows and answers each read with the most likely next token after
each node read and its probability (a few numbers a row, JSON through the shared-memory mailboxes). A
drafter process that dies fails its reads with a PeerError: FusedDrafters routes it no more, with a warning,
and generation goes on with the others.
"""
from __future__ import annotations

import atexit
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specmesh.engine.stats import Stats
from specmesh.model.loader import DTYPES, load_model
from specmesh.proposers.draft_model import DraftModel
from specmesh.proposers.fused_drafters import Candidates, Drafter
from specmesh.runtime.link import Link, PeerError, connect, lending_wanted
from specmesh.timing import share_of_cores

SERVE = f"{__name__}:DrafterServer"
TIMEOUT_S = 30.0


def roles(drafters: int) -> list[str]:
    """The ranks of a verifier and its drafter processes."""
    return ["verifier"] + [f"drafter{n}" for n in range(drafters)]


@dataclass
class Row:
    """What a drafter process knows of a sequence: its prompt window, newest token and draft forwards."""
    ids: list[int] = field(default_factory=list)
    last: int = 0
    stats: Stats = field(default_factory=Stats)


class DrafterServer:
    """Rank n: drafter n of the config's list, serving rank 0's reads until shutdown."""

    def __init__(self, config: dict):
        path = Path(config["drafters"][int(os.environ["RANK"]) - 1])
        self.model = load_model(path, DTYPES[config["dtype"]], torch.device(config["device"]), draft=True,
                                quant=config.get("quant"))

    def run(self, link: Link) -> None:
        drafter, rows = None, []
        with torch.inference_mode():
            while not (m := link.recv_json(0, idle=True)).get("shutdown"):
                op = m["op"]
                if op == "start":
                    draft = DraftModel(self.model, m["rows"], m["max_len"], m["window"], width=2, max_children=2)
                    drafter, rows = Drafter(draft), [Row() for _ in range(m["rows"])]
                elif op == "admit":
                    rows[m["row"]] = Row(m["ids"])
                    drafter.admit(m["row"], rows[m["row"]])
                elif op == "move_row":
                    drafter.move_row(m["src"], m["dst"])
                    rows[m["dst"]] = rows[m["src"]]
                elif op == "begin":
                    for row, last in zip(rows, m["last"]):
                        row.last = last
                    drafter.begin(rows[:len(m["last"])])
                elif op == "finish":
                    drafter.finish(m["row"], m["accepted"])
                elif op == "prompt":
                    drafter.read_prompt(m["row"], torch.tensor(m["ids"]), torch.tensor(m["probs"]))
                    link.send_json({"ce": drafter.prompt_ce()}, 0)
                else:                                       # a read: answer it
                    seqs = rows[:m["rows"]]
                    before = [s.stats.draft_forwards for s in seqs]
                    if op == "root":
                        drafter.read_root(seqs)
                    else:
                        drafter.read_level(seqs, [tuple(p) for p in m["pairs"]])
                    probs, tokens = drafter.result()
                    link.send_json({"probs": probs, "tokens": tokens,
                                    "forwards": [s.stats.draft_forwards - b for s, b in zip(seqs, before)]}, 0)


class RemoteDrafter:
    """Rank 0's handle on drafter process `rank` (the Drafter interface)."""
    free = False

    def __init__(self, link: Link, rank: int, window: int):
        self.link, self.rank, self.window = link, rank, window
        self.seqs: list = []
        self.dead = not link.alive(rank)            # gone before this engine started: never routed

    def _send(self, message: dict) -> None:
        self.link.send_json(message, self.rank)

    def start(self, rows: int, max_len: int) -> "RemoteDrafter":
        self._send({"op": "start", "rows": rows, "max_len": max_len, "window": self.window})
        return self

    def admit(self, row: int, seq) -> None:
        self._send({"op": "admit", "row": row, "ids": list(seq.ids[-self.window:])})

    def move_row(self, src: int, dst: int) -> None:
        self._send({"op": "move_row", "src": src, "dst": dst})

    def begin(self, seqs) -> None:
        self._send({"op": "begin", "last": [s.last for s in seqs]})

    def read_root(self, seqs) -> None:
        self.seqs = seqs
        self._send({"op": "root", "rows": len(seqs)})

    def read_level(self, seqs, pairs: list[tuple[int, int]]) -> None:
        self.seqs = seqs
        self._send({"op": "level", "rows": len(seqs), "pairs": [list(p) for p in pairs]})

    def result(self) -> Candidates:
        reply = self.link.recv_json(self.rank)
        for seq, n in zip(self.seqs, reply["forwards"]):
            seq.stats.draft_forwards += n
        return reply["probs"], reply["tokens"]

    def finish(self, row: int, accepted: list[int]) -> None:
        self._send({"op": "finish", "row": row, "accepted": accepted})

    def read_prompt(self, row: int, top_ids: torch.Tensor, top_p: torch.Tensor) -> None:
        self._send({"op": "prompt", "row": row, "ids": top_ids.tolist(),
                    "probs": [[round(p, 5) for p in ps] for ps in top_p.tolist()]})

    def prompt_ce(self) -> float | None:
        return self.link.recv_json(self.rank)["ce"]


class DrafterPool:
    """Rank 0's drafter processes (Models.remote): started once, a fresh set of rows per engine."""

    def __init__(self, link: Link, window: int):
        self.link, self.window, self.broken = link, window, False
        atexit.register(self.close)

    @classmethod
    def start(cls, paths: list[Path], dtype: torch.dtype, device: str, quant: str | None, window: int,
              timeout: float = TIMEOUT_S) -> "DrafterPool":
        config = {"serve": SERVE, "drafters": [str(p) for p in paths], "dtype": str(dtype).split(".")[-1],
                  "device": device, "quant": quant, "timeout": timeout, "threads": share_of_cores(len(paths) + 1)}
        return cls(connect(roles(len(paths)), config, timeout, lend=lending_wanted()), window)

    def drafters(self, rows: int, max_len: int) -> list[RemoteDrafter]:
        """A drafter handle per process, each with `rows` fresh cache rows (`dead` where its process is gone)."""
        handles = []
        for rank in range(1, len(self.link.roles)):
            handle = RemoteDrafter(self.link, rank, self.window)
            if not handle.dead:
                try:
                    handle.start(rows, max_len)
                except PeerError:
                    handle.dead = True
            handles.append(handle)
        return handles

    def close(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.shutdown(mailbox=True)
