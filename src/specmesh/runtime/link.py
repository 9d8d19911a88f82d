"""Point-to-point links between specmesh processes, on torch.distributed with no global state.

A `Link` is one process's end of a small group: its rank, every rank's role (and
pid), and tensor/object send and receive whose waits are bounded, so that a peer
that died or stopped answering becomes a `PeerError` naming it rather than a hang.
Each link builds its own gloo process group from its own TCP store, so one process
may hold several (the bench runs pearl in float32 and in bfloat16).

Two ways in:
* `launch(roles, config)` on one machine: this process is rank 0; ranks 1.. start as
  `python -m specmesh.runtime.worker` subprocesses (they die with it), and one line per
  process goes to stderr: `rank R role ROLE pid P`.
* under torchrun every rank runs the same command and `join_env()` meets the others
  through env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

Messages are small (a few token ids, a decision; q rows when sampling; a tree layer's
hidden states), so they stay on the host even when the models sit on GPUs: NCCL would
save nothing on a few bytes and cannot bound an idle wait between jobs. When every rank
runs on this machine (x86), messages of up to MAILBOX_BYTES go through shared-memory
mailboxes (`Mailboxes`): the receiver polls, so nothing waits for a thread to be woken, yielding
its core at each poll to any thread that can run (with more ranks than cores, as cosine's drafter
processes beside a verifier on 2 cores, polling without yielding made its steps 5x slower), and
after SPIN_S sleeps on a futex that the sender wakes (a rank waiting long burns no core).
Ranks that take turns (`lend`: a pipeline's ranks, pearl's two, cosine's verifier and drafter processes) lend their
cores while they wait: a waiting rank sleeps at once (after LEND_SPIN_S) and says so in shared memory
(`Mailboxes.busy`), the kernels' pool (csrc/pool.c) runs the computing rank's loops on the cores no busy rank holds,
and a rank that sends a waiting rank its message marks it busy first, so that a borrowed core is free by the time
its owner wakes.
Through gloo a message had a long tail while both cores computed (gloo's I/O thread waits for
a core), which cost PipeDec's pipeline time every timestep (docs/pipelines.md). Between hosts, messages of up to
SOCKET_BYTES go on a TCP connection of each pair's own (runtime/sockets.py), for the same reason (docs/hosts.md).
Larger messages (a prompt's hidden states) go through gloo.
"""
from __future__ import annotations

import datetime
import errno
import functools
import ipaddress
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from specmesh.kernels.build import kernel_lib, inherited_kernels
from specmesh.runtime import PeerError  # noqa: F401  (raised here; declared where the CLI reads it)
from specmesh.runtime.sockets import KEEPALIVE_S, SOCKET_BYTES, Silent, Sockets
from specmesh.settings import settings

IDLE = datetime.timedelta(days=7)       # how long a rank may wait for work between jobs
STARTUP_S = 120.0                        # a worker must load its model and join within this
MAILBOX_SLOTS, MAILBOX_BYTES = 8, 1 << 18   # per ordered pair of ranks: messages in flight, bytes each
SPIN_S, SLEEP_S = 0.05, 0.05            # a waiting rank polls for SPIN_S, then sleeps on a futex,
                                         # waking every SLEEP_S to check its peer
LEND_SPIN_S = 30e-6                      # a rank that lends its core polls this long before it sleeps

WRITTEN, READ = 0, 1                    # a mailbox's counters
UNREACHABLE = (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)   # a socket's silent peer

def futex_wait(address: int, seen: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at `address` holds `seen` (at most `timeout_s`): csrc/pool.c's futex, or a plain
    sleep where the kernels do not build (the waiter then looks again after `timeout_s`)."""
    if (lib := kernel_lib()) is None:
        time.sleep(timeout_s)
    else:
        lib.shared_wait(address, seen, timeout_s)


def futex_wake(address: int) -> None:
    if (lib := kernel_lib()) is not None:
        lib.shared_wake(address)


class Mailbox:
    """One direction between two ranks: a ring of MAILBOX_SLOTS messages in shared memory, one
    writer and one reader. [0] counts messages written, [1] messages read (x86 keeps stores in
    order, so a reader that sees the count also sees the message)."""

    def __init__(self, region: np.ndarray):
        self.count = region[:16].view(np.int64)                             # [written, read]
        self.sizes = region[64:64 + 8 * MAILBOX_SLOTS].view(np.int64)
        self.slots = region[128:].reshape(MAILBOX_SLOTS, MAILBOX_BYTES)
        self.address = region.ctypes.data                                   # count[i] at address + 8 i

    def put(self, data: np.ndarray) -> int:
        """Write `data` (uint8) if a slot is free: its sequence number, else 0."""
        written, read = int(self.count[0]), int(self.count[1])
        if written - read >= MAILBOX_SLOTS:
            return 0
        slot = written % MAILBOX_SLOTS
        self.slots[slot, :data.size] = data
        self.sizes[slot] = data.size
        self.count[0] = written + 1
        futex_wake(self.address)
        return written + 1

    def counter(self, i: int) -> int:
        """The low 32 bits of count[i], the word a futex sleeps on."""
        return int(self.count[i]) & 0xFFFFFFFF

    def taken(self, seq: int) -> bool:
        return int(self.count[1]) >= seq

    def get(self, out: np.ndarray) -> bool:
        """Fill `out` (uint8) with the next message if there is one."""
        written, read = int(self.count[0]), int(self.count[1])
        if written == read:
            return False
        slot = read % MAILBOX_SLOTS
        if self.sizes[slot] != out.size:
            raise RuntimeError(f"message of {int(self.sizes[slot])} bytes where {out.size} were expected")
        out[:] = self.slots[slot, :out.size]
        self.count[1] = read + 1
        futex_wake(self.address + 8)
        return True


class Mailboxes:
    """Shared memory for every ordered pair of ranks on this machine: rank 0 creates a file in
    /dev/shm, every rank maps it, and rank 0 removes the name once all have (nothing is left
    behind however the processes end). After the mailboxes, one int32 a rank: `busy`, its threads
    while it computes and 0 while it waits (each rank writes its own, and a sender its receiver's),
    and `threads`, its threads."""
    REGION = 128 + MAILBOX_SLOTS * MAILBOX_BYTES

    def __init__(self, store: dist.Store, rank: int, world: int):
        self.world, boxes = world, world * world * self.REGION
        size = boxes + 8 * world
        if rank == 0:
            path = f"/dev/shm/specmesh-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            with open(path, "wb") as f:
                f.truncate(size)                # tmpfs: pages are allocated when first written
            store.set("shm/path", path)
        else:
            path = store.get("shm/path").decode()
        self.memory = torch.from_file(path, shared=True, size=size, dtype=torch.uint8).numpy()
        self.busy = self.memory[boxes:boxes + 4 * world].view(np.int32)
        self.threads = self.memory[boxes + 4 * world:].view(np.int32)
        store.set(f"shm/mapped/{rank}", "1")
        if rank == 0:
            store.wait([f"shm/mapped/{r}" for r in range(world)])
            os.unlink(path)

    @classmethod
    def possible(cls, store: dist.Store, rank: int, world: int) -> bool:
        """Rank 0 decides for all: every rank on this machine, an x86 one (see Mailbox) whose
        /dev/shm has room for every mailbox (tmpfs allocates pages as they are written, and one
        written past its room is a SIGBUS)."""
        store.set(f"host/{rank}", socket.gethostname())
        if rank == 0:
            same = len({store.get(f"host/{r}") for r in range(world)}) == 1
            shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
            room = shm is not None and shm.f_bavail * shm.f_frsize >= 2 * world * (world * cls.REGION + 8)
            store.set("shm/use", "1" if same and room and platform.machine() in ("x86_64", "AMD64") else "0")
        return store.get("shm/use") == b"1"

    def box(self, src: int, dst: int) -> Mailbox:
        start = (src * self.world + dst) * self.REGION
        return Mailbox(self.memory[start:start + self.REGION])


class Link:
    def __init__(self, store: dist.Store, rank: int, roles: list[str], timeout_s: float,
                 procs: dict[int, subprocess.Popen] | None = None, lend: bool = False):
        self.rank, self.roles, self.timeout_s, self.store = rank, roles, timeout_s, store
        self.procs = procs or {}
        # the messages this rank sent or received, and their bytes, by way: "socket", "mailbox", "gloo" (and
        # "socket bytes" ..); a rank's own view, which in a group of two is every message
        self.traffic: Counter[str] = Counter()
        store.set(f"pid/{rank}", str(os.getpid()))
        self.pids = [int(store.get(f"pid/{r}")) for r in range(len(roles))]
        address = this_address(store, rank, len(roles))
        self.group = gloo_group(dist.PrefixStore("link", store), rank, len(roles), address)
        boxes = Mailboxes(store, rank, len(roles)) if Mailboxes.possible(store, rank, len(roles)) else None
        self.hosts = [store.get(f"host/{r}").decode() for r in range(len(roles))]     # (set by `possible`)
        peers = [r for r in range(len(roles)) if r != rank] if boxes else []
        self.outbox = {r: boxes.box(rank, r) for r in peers}         # empty: everything through gloo
        self.inbox = {r: boxes.box(r, rank) for r in peers}
        self.boxes = boxes if lend else None                         # None: this link's ranks lend no cores
        self.sockets = Sockets(store, rank, self.hosts, address) if len(set(self.hosts)) > 1 else None
        if self.boxes:
            self._computing()
            if rank:                                                 # workers lend for good; rank 0 in `lending`
                lend_cores(self.boxes)

    @contextmanager
    def lending(self):
        """Rank 0, around a job: its kernels run on the cores of the ranks that wait (csrc/pool.c)."""
        if not self.boxes:
            yield
            return
        self._computing()
        lend_cores(self.boxes)
        try:
            yield
        finally:
            lend_cores(None)

    def _computing(self) -> None:
        self.boxes.threads[self.rank] = self.boxes.busy[self.rank] = torch.get_num_threads()

    def describe(self, rank: int) -> str:
        """`rank 1 (draft, pid 4250)`; across hosts with the peer's: `rank 1 (draft, pid 4250 on host1)`."""
        where = f" on {self.hosts[rank]}" if self.sockets is not None else ""
        return f"rank {rank} ({self.roles[rank]}, pid {self.pids[rank]}{where})"

    # -- tensors ------------------------------------------------------------------------------
    def by_socket(self, peer: int, nbytes: int) -> bool:
        """Whether a message of `nbytes` to or from `peer`, on another host, goes through its socket (any message
        that fits, job messages too: a socket's idle wait is bounded by keepalive) rather than gloo."""
        return self.sockets is not None and peer in self.sockets and nbytes <= SOCKET_BYTES

    def by_mailbox(self, peer: int, nbytes: int) -> bool:
        """Whether a message of `nbytes` to or from `peer` goes through a mailbox (whole once put) rather than gloo."""
        return peer in self.outbox and nbytes <= MAILBOX_BYTES

    def send(self, tensor: torch.Tensor, dst: int, wait: bool = True, mailbox: bool = True
             ) -> Callable[[], None] | None:
        """Send `tensor` to `dst`. It completes once the receiver has taken it (a lending link's mailbox message: once
        it is put, since the receiver may be asleep); with `wait=False`
        this returns at once with a function that waits for that (keeping the tensor alive).
        `mailbox=False`: on this host through gloo whatever the size (job messages, for which a rank waits idle);
        to another host a message that fits goes on its socket either way."""
        tensor = tensor.contiguous()
        way = self._way(dst, tensor.nbytes, mailbox)
        if way == "socket":                                 # in the kernel's buffer once sent
            self._by_socket(lambda: self.sockets.send(dst, memoryview(as_bytes(tensor))), dst)
            return None if wait else (lambda: None)
        if way == "mailbox":
            box, data = self.outbox[dst], as_bytes(tensor)
            if self.boxes:                  # it computes once this arrives: free its core now
                self.boxes.busy[dst] = self.boxes.threads[dst]
            seq = self._poll(lambda: box.put(data), dst, self.timeout_s, box, READ)
            if self.boxes:                  # whole once put: waiting for a sleeping receiver to wake costs a hop
                return None if wait else (lambda: None)
            done = functools.partial(self._poll, lambda: box.taken(seq), dst, self.timeout_s, box, READ)
        else:
            work = self._guard(lambda: self.group.send([tensor], dst, 0), dst)
            done = functools.partial(self._wait, work, dst, self.timeout_s, tensor)
        if not wait:
            return done
        done()
        return None

    def recv(self, tensor: torch.Tensor, src: int, idle: bool = False, mailbox: bool = True) -> torch.Tensor:
        """Fill `tensor` from `src`, waiting at most the link's timeout (`idle`: as long as it takes,
        for a rank waiting for its next job; a peer's death still ends the wait at once).
        `mailbox` as in `send`: both ends must agree."""
        way = self._way(src, tensor.nbytes, mailbox)
        if way == "socket":
            out = memoryview(as_bytes(tensor))
            self._by_socket(lambda: self.sockets.recv_into(src, out, None if idle else self.timeout_s), src)
            return tensor
        if way == "mailbox":
            box, out = self.inbox[src], as_bytes(tensor)
            self._poll(lambda: box.get(out), src, math.inf if idle else self.timeout_s, box, WRITTEN)
            return tensor
        work = self._guard(lambda: self.group.recv([tensor], src, 0), src)
        self._wait(work, src, None if idle else self.timeout_s)
        return tensor

    def _way(self, peer: int, nbytes: int, mailbox: bool) -> str:
        """How a message of `nbytes` to or from `peer` goes ("socket", "mailbox" or "gloo"), counted in `traffic`."""
        way = "socket" if self.by_socket(peer, nbytes) else "mailbox" if mailbox and self.by_mailbox(peer, nbytes) \
            else "gloo"
        self.traffic[way] += 1
        self.traffic[f"{way} bytes"] += nbytes
        return way

    def _poll(self, ready: Callable, peer: int, timeout_s: float, box: Mailbox, counter: int):
        """Poll `ready()` until it returns something true (returned); after SPIN_S, sleep until
        `box`'s `counter` changes (a futex), waking every SLEEP_S to check that `peer` still runs
        and answers in time. A rank that lends its cores sleeps after LEND_SPIN_S, idle in `busy`."""
        if value := ready():
            return value
        spin, lent = (LEND_SPIN_S if self.boxes else SPIN_S), False
        start, polls = time.monotonic(), 0
        try:
            while not (value := ready()):
                polls += 1
                waited = time.monotonic() - start
                if waited > spin:
                    if self.boxes and not lent:
                        self.boxes.busy[self.rank], lent = 0, True
                    seen = box.counter(counter)
                    if value := ready():
                        break
                    futex_wait(box.address + 8 * counter, seen, SLEEP_S)
                    if value := ready():    # woken by the message: no need to ask whether the peer lives
                        break
                elif polls % 512:
                    os.sched_yield()        # a core another process needs goes to it (more ranks than cores)
                    continue
                if not self._alive(peer):
                    raise self._error(peer, self._fate(peer, RuntimeError("its process ended")))
                if waited > timeout_s:
                    raise self._error(peer, f"did not answer within {timeout_s:g} s")
        finally:
            if lent:
                self._computing()
        return value

    def alive(self, rank: int) -> bool:
        return self._alive(rank)

    def _alive(self, rank: int) -> bool:
        """The rank's process runs (a stopped one counts; a zombie does not)."""
        if rank in self.procs:
            return self.procs[rank].poll() is None
        try:
            with open(f"/proc/{self.pids[rank]}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (FileNotFoundError, IndexError):
            return False

    def _wait(self, work, peer: int, timeout_s: float | None, *keep_alive) -> None:
        self._guard(lambda: work.wait() if timeout_s is None else work.wait(datetime.timedelta(seconds=timeout_s)),
                    peer)

    def _by_socket(self, call, peer: int):
        """A socket call; its failure becomes a PeerError naming the peer."""
        try:
            return call()
        except Silent:
            raise self._error(peer, f"did not answer within {self.timeout_s:g} s") from None
        except OSError as e:
            if isinstance(e, TimeoutError) or e.errno in UNREACHABLE:
                raise self._error(peer, f"cannot be reached ({e.strerror or 'no answer'} for about {KEEPALIVE_S} s: "
                                        "its host or its link is down)") from None
            raise self._error(peer, f"is gone ({e.strerror or e})") from None

    def _guard(self, call, peer: int):
        """Run a gloo call; any failure becomes a PeerError naming the peer."""
        try:
            return call()
        except RuntimeError as e:
            raise self._error(peer, self._fate(peer, e)) from None

    def _error(self, peer: int, fate: str) -> PeerError:
        others = [f"{self.describe(r)} {self._fate(r, RuntimeError('its process ended'))}"
                  for r, proc in self.procs.items() if r != peer and proc.poll() is not None]
        return PeerError("; ".join(others + [f"{self.describe(peer)} {fate}"]))  # a dead rank downstream first

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
        """A JSON object (a job, shutdown) through gloo: the receiver may be waiting idle."""
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        if self.boxes:                      # it computes once this arrives: free its core now
            self.boxes.busy[dst] = self.boxes.threads[dst]
        self.send(torch.tensor([data.numel()]), dst, mailbox=False)
        self.send(data, dst, mailbox=False)

    def recv_obj(self, src: int, idle: bool = False):
        """`idle`: wait as long as it takes (a rank between jobs), lending this rank's cores meanwhile."""
        if self.boxes and idle:
            self.boxes.busy[self.rank] = 0
        try:
            size = int(self.recv(torch.zeros(1, dtype=torch.int64), src, idle, mailbox=False))
        finally:
            if self.boxes and idle:
                self._computing()
        return json.loads(bytes(self.recv(torch.zeros(size, dtype=torch.uint8), src, mailbox=False).tolist()))

    # -- JSON messages within a job, through the mailboxes where they fit -------------------------------
    def send_json(self, obj, dst: int) -> None:
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        self.send(torch.tensor([data.numel()]), dst)
        self.send(data, dst)

    def recv_json(self, src: int, idle: bool = False):
        """`idle`: wait as long as it takes (a rank between jobs), still failing at once if `src` dies."""
        size = int(self.recv(torch.zeros(1, dtype=torch.int64), src, idle=idle))
        return json.loads(bytes(self.recv(torch.zeros(size, dtype=torch.uint8), src).tolist()))

    # -- shutdown -----------------------------------------------------------------------------
    def shutdown(self, healthy: bool = True, mailbox: bool = False) -> None:
        """Rank 0: tell every other rank to exit (when the link is still `healthy`), then close:
        workers get a grace period to exit, or none after a failure. `mailbox`: the ranks wait for
        their next message in recv_json (else recv_obj)."""
        send = self.send_json if mailbox else self.send_obj
        for rank in range(1, len(self.roles)) if healthy else ():
            try:
                send({"shutdown": True}, rank)
            except PeerError:
                healthy = False
        self.close(grace_s=5.0 if healthy else 0.0)

    def close(self, grace_s: float = 5.0) -> None:
        """Wait briefly for launched workers to exit, then kill what is left."""
        if self.boxes and self.rank:
            lend_cores(None)
        if self.sockets is not None:
            self.sockets.close()
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = {}


def gloo_group(store: dist.Store, rank: int, world: int, address: str) -> dist.ProcessGroupGloo:
    """A gloo group whose connections leave from `address` (this_address): gloo's default, the address the hostname
    resolves to, is the loopback address on many hosts (127.0.1.1) or nothing, and the ranks on other hosts then
    cannot reach it."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = IDLE
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    return dist.ProcessGroupGloo(store, rank, world, options)


def this_address(store: dist.Store, rank: int, world: int) -> str:
    """The address this rank's connections leave from and the other ranks reach it at: GLOO_SOCKET_IFNAME's, where
    set, else this host's on the route to the rendezvous (MASTER_ADDR). Where that route is the loopback, because
    the rendezvous is this host and its name resolves here to 127.0.1.1 (as on many hosts), while ranks run on other
    hosts: the address those ranks reached this host at (each rank says in the store what MASTER_ADDR named for
    it)."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    master, here = os.environ.get("MASTER_ADDR", "127.0.0.1"), socket.gethostname()
    try:
        own, named = route_to(master)
    except PeerError:
        if not interface:
            raise
        own = named = "-"
    store.set(f"route/{rank}", f"{here} {named}")          # (every rank says, whatever it binds to)
    if interface:
        return interface_address(interface)
    if not ipaddress.ip_address(own).is_loopback:
        return own
    seen = {ip for host, ip in (store.get(f"route/{r}").decode().split() for r in range(world))
            if host != here and ip != "-" and not ipaddress.ip_address(ip).is_loopback}
    if not seen:
        return own                                          # every rank on this host
    address = seen.pop()
    try:
        socket.create_server((address, 0)).close()
    except OSError as e:
        raise PeerError(f"MASTER_ADDR {master} is {here} itself, which the other hosts reach at {address}, and that is "
                        f"no address of {here} ({e.strerror or e}): name this host's interface in "
                        "GLOO_SOCKET_IFNAME") from None
    return address


def interface_address(interface: str) -> str:
    """The IPv4 address of this host's `interface` (GLOO_SOCKET_IFNAME)."""
    import fcntl
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:            # SIOCGIFADDR: the interface's IPv4 address
            request = struct.pack("256s", interface[:15].encode())
            return socket.inet_ntoa(fcntl.ioctl(probe.fileno(), 0x8915, request)[20:24])
        except OSError as e:
            raise PeerError(f"GLOO_SOCKET_IFNAME={interface}: no IPv4 address on that interface here "
                            f"({e.strerror or e})") from None


def route_to(host: str) -> tuple[str, str]:
    """This host's address on the route to `host`, and the address `host` names from here (no packet is sent); or a
    PeerError saying why there is none."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0], probe.getpeername()[0]
    except OSError as e:
        raise PeerError(f"no route from {socket.gethostname()} to the rendezvous host {host} (MASTER_ADDR): "
                        f"{e.strerror or e}; check the address, or name this host's interface in "
                        "GLOO_SOCKET_IFNAME") from None


def lend_cores(boxes: Mailboxes | None) -> None:
    """Run this process's kernel loops on its own threads plus the cores no busy rank of `boxes` holds
    (None: OpenMP's team again)."""
    from specmesh.kernels.build import kernel_lib
    kernel = kernel_lib()
    if kernel is not None:
        kernel.pool_lend(None if boxes is None else boxes.busy.ctypes.data, 0 if boxes is None else boxes.world,
                         len(os.sched_getaffinity(0)))


def as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's memory as uint8 (shared with it)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def lending_wanted() -> bool:
    """Whether ranks that take turns lend their cores (the default; SPECMESH_KERNELS=no-lend turns it off, to
    compare)."""
    return settings().kernel("lend") is not False


def connect(roles: list[str], config: dict, timeout_s: float, lend: bool = False) -> Link:
    """Rank 0's link: under torchrun the ranks it started, else workers launched here. `lend`: the ranks
    take turns and lend each other their cores while they wait (see the module docstring)."""
    return join_env(roles, timeout_s, lend) if under_torchrun() else launch(roles, config | {"lend": lend}, timeout_s)


def launch(roles: list[str], config: dict, timeout_s: float) -> Link:
    """Start ranks 1.. of `roles` as worker processes on this machine; return rank 0's link.

    `config` (JSON) tells the workers what to load and serve (see specmesh.runtime.worker)."""
    store = dist.TCPStore("127.0.0.1", 0, len(roles), True, timeout=datetime.timedelta(seconds=STARTUP_S),
                          wait_for_workers=False)
    procs = {}
    print(f"rank 0 role {roles[0]} pid {os.getpid()}", file=sys.stderr, flush=True)
    for rank in range(1, len(roles)):
        env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "RANK": str(rank),
                            "WORLD_SIZE": str(len(roles)),
                            "SPECMESH_WORKER": json.dumps(config | {"roles": roles, "parent": os.getpid()}),
                            **inherited_kernels()}
        procs[rank] = subprocess.Popen([sys.executable, "-m", "specmesh.runtime.worker"], env=env)
        print(f"rank {rank} role {roles[rank]} pid {procs[rank].pid}", file=sys.stderr, flush=True)
    try:
        wait_ready(store, procs)
        return Link(store, 0, roles, timeout_s, procs, config.get("lend", False))
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


def join_env(roles: list[str], timeout_s: float, lend: bool = False) -> Link:
    """This process's link under torchrun (or as a launched worker): rank from the environment.
    Under torchrun each rank announces itself (`rank R role ROLE pid P`), as the launcher would."""
    store, rank, world = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=STARTUP_S)))
    if world != len(roles):
        raise ValueError(f"this job needs {len(roles)} processes ({', '.join(roles)}), torchrun started {world}")
    if under_torchrun():
        print(f"rank {rank} role {roles[rank]} pid {os.getpid()}", file=sys.stderr, flush=True)
    store.set(f"ready/{rank}", "1")
    return Link(store, rank, roles, timeout_s, lend=lend)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "SPECMESH_WORKER" not in os.environ
