"""Point-to-point links between specmesh processes, on torch.distributed with no global state.

A `Link` is one process's end of a small group: its rank, every rank's role (and
pid), and tensor/object send and receive whose waits are bounded, so that a peer
that died or stopped answering becomes a `PeerError` naming it rather than a hang.
Each link builds its own gloo process group from its own TCP store, so one process
may hold several (the bench runs pearl in float32 and in bfloat16).

Two ways in:
* `launch(roles, config)` on one machine: this process is rank 0; ranks 1.. start as
  `python -m specmesh.dist.worker` subprocesses (they die with it), and one line per
  process goes to stderr: `rank R role ROLE pid P`.
* under torchrun every rank runs the same command and `join_env()` meets the others
  through env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

Messages are small (a few token ids, a decision; q rows when sampling), so they go
through gloo on the host even when the models sit on GPUs: NCCL would save nothing on
a few bytes and cannot bound an idle wait between jobs.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

IDLE = datetime.timedelta(days=7)       # how long a rank may wait for work between jobs
STARTUP_S = 120.0                        # a worker must load its model and join within this


class PeerError(RuntimeError):
    """Another rank died or did not answer in time."""


class Link:
    def __init__(self, store: dist.Store, rank: int, roles: list[str], timeout_s: float,
                 procs: dict[int, subprocess.Popen] | None = None):
        self.rank, self.roles, self.timeout_s = rank, roles, timeout_s
        self.procs = procs or {}
        store.set(f"pid/{rank}", str(os.getpid()))
        self.pids = [int(store.get(f"pid/{r}")) for r in range(len(roles))]
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("link", store), rank, len(roles), IDLE)

    def describe(self, rank: int) -> str:
        return f"rank {rank} ({self.roles[rank]}, pid {self.pids[rank]})"

    # -- tensors ------------------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, wait: bool = True) -> Callable[[], None] | None:
        """Send `tensor` to `dst`. A gloo send completes only once the receiver has posted its
        receive; with `wait=False` this returns at once with a function that waits for that
        (which keeps the tensor alive until then)."""
        tensor = tensor.contiguous()
        work = self._guard(lambda: self.group.send([tensor], dst, 0), dst)
        done = functools.partial(self._wait, work, dst, self.timeout_s, tensor)
        if not wait:
            return done
        done()
        return None

    def recv(self, tensor: torch.Tensor, src: int, idle: bool = False) -> torch.Tensor:
        """Fill `tensor` from `src`, waiting at most the link's timeout (`idle`: as long as it takes,
        for a rank waiting for its next job; a peer's death still ends the wait at once)."""
        work = self._guard(lambda: self.group.recv([tensor], src, 0), src)
        self._wait(work, src, None if idle else self.timeout_s)
        return tensor

    def _wait(self, work, peer: int, timeout_s: float | None, *keep_alive) -> None:
        self._guard(lambda: work.wait() if timeout_s is None else work.wait(datetime.timedelta(seconds=timeout_s)),
                    peer)

    def _guard(self, call, peer: int):
        """Run a gloo call; any failure becomes a PeerError naming the peer."""
        try:
            return call()
        except RuntimeError as e:
            others = [f"{self.describe(r)} {self._fate(r, e)}" for r, proc in self.procs.items()
                      if r != peer and proc.poll() is not None]     # a dead rank downstream explains the rest
            raise PeerError("; ".join(others + [f"{self.describe(peer)} {self._fate(peer, e)}"])) from None

    def _fate(self, peer: int, error: RuntimeError) -> str:
        proc = self.procs.get(peer)
        if proc is not None:
            try:
                code = proc.wait(timeout=1.0)
                return (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
            except subprocess.TimeoutExpired:
                pass
        if "Timed out" in str(error) or "timeout" in str(error).lower():
            return f"did not answer within {self.timeout_s:g} s"
        return f"is gone ({str(error).splitlines()[0][:160]})"

    # -- JSON objects (job descriptions) ------------------------------------------------------
    def send_obj(self, obj, dst: int) -> None:
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        self.send(torch.tensor([data.numel()]), dst)
        self.send(data, dst)

    def recv_obj(self, src: int, idle: bool = False):
        size = int(self.recv(torch.zeros(1, dtype=torch.int64), src, idle))
        return json.loads(bytes(self.recv(torch.zeros(size, dtype=torch.uint8), src).tolist()))

    # -- shutdown -----------------------------------------------------------------------------
    def shutdown(self, healthy: bool = True) -> None:
        """Rank 0: tell every other rank to exit (when the link is still `healthy`), then close:
        workers get a grace period to exit, or none after a failure."""
        if healthy:
            try:
                for rank in range(1, len(self.roles)):
                    self.send_obj({"shutdown": True}, rank)
            except PeerError:
                healthy = False
        self.close(grace_s=5.0 if healthy else 0.0)

    def close(self, grace_s: float = 5.0) -> None:
        """Wait briefly for launched workers to exit, then kill what is left."""
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = {}


def connect(roles: list[str], config: dict, timeout_s: float) -> Link:
    """Rank 0's link: under torchrun the ranks it started, else workers launched here."""
    return join_env(roles, timeout_s) if under_torchrun() else launch(roles, config, timeout_s)


def launch(roles: list[str], config: dict, timeout_s: float) -> Link:
    """Start ranks 1.. of `roles` as worker processes on this machine; return rank 0's link.

    `config` (JSON) tells the workers what to load and serve (see specmesh.dist.worker)."""
    store = dist.TCPStore("127.0.0.1", 0, len(roles), True, timeout=datetime.timedelta(seconds=STARTUP_S),
                          wait_for_workers=False)
    procs = {}
    print(f"rank 0 role {roles[0]} pid {os.getpid()}", file=sys.stderr, flush=True)
    for rank in range(1, len(roles)):
        env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "RANK": str(rank),
                            "WORLD_SIZE": str(len(roles)),
                            "SPECMESH_WORKER": json.dumps(config | {"roles": roles, "parent": os.getpid()})}
        procs[rank] = subprocess.Popen([sys.executable, "-m", "specmesh.dist.worker"], env=env)
        print(f"rank {rank} role {roles[rank]} pid {procs[rank].pid}", file=sys.stderr, flush=True)
    try:
        wait_ready(store, procs)
        return Link(store, 0, roles, timeout_s, procs)
    except BaseException:
        for proc in procs.values():
            proc.kill()
        raise


def wait_ready(store: dist.Store, procs: dict[int, subprocess.Popen]) -> None:
    """Wait until every worker has loaded its model and said so (or fail if one exits first)."""
    deadline = time.monotonic() + STARTUP_S
    for rank, proc in procs.items():
        while not store.check([f"ready/{rank}"]):
            if proc.poll() is not None:
                raise PeerError(f"rank {rank} (pid {proc.pid}) exited with code {proc.returncode} while starting")
            if time.monotonic() > deadline:
                raise PeerError(f"rank {rank} (pid {proc.pid}) did not start within {STARTUP_S:g} s")
            time.sleep(0.01)


def join_env(roles: list[str], timeout_s: float) -> Link:
    """This process's link under torchrun (or as a launched worker): rank from the environment.
    Under torchrun each rank announces itself (`rank R role ROLE pid P`), as the launcher would."""
    store, rank, world = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=STARTUP_S)))
    if world != len(roles):
        raise ValueError(f"this job needs {len(roles)} processes ({', '.join(roles)}), torchrun started {world}")
    if under_torchrun():
        print(f"rank {rank} role {roles[rank]} pid {os.getpid()}", file=sys.stderr, flush=True)
    store.set(f"ready/{rank}", "1")
    return Link(store, rank, roles, timeout_s)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "SPECMESH_WORKER" not in os.environ
