"""Several hosts on one machine, for running the multi-process methods across a real network: each host a Linux
network namespace with its own interface, address and hostname (a UTS namespace) and its own /dev/shm and
/etc/hosts (a mount namespace with a private tmpfs and file), joined to the others by a veth pair through a bridge
in a switch namespace of their own, each link's rate set by `tc ... tbf`. A host's /etc/hosts is a Debian host's:
its own name is 127.0.1.1, the others' their addresses (as a cluster's DNS gives them). Traffic between hosts
crosses the kernel's network stack over TCP; no memory is shared. Nothing outside the namespaces made here is
touched: the switch is one of them, and no address is routed beyond it. Needs root (the namespaces) and iproute2
and util-linux (`ip`, `tc`, `unshare`).

    with Hosts(2, rate="1gbit") as hosts:
        hosts.run(0, ["hostname"])
        results = hosts.torchrun(["-m", "specmesh.cli", "generate", "--method", "pearl", "def f():"])

Leaving the block kills every process left on any host and removes the namespaces, also after an error.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.203.{block}.{host}"        # host i's address: .i+1 in a /24 of its own for each Hosts
TOOLS = ("ip", "tc", "unshare")
JOIN_S = 30             # torchrun's rendezvous: a host that has not joined by then fails the job
RENDEZVOUS = ("address", "name", "c10d")       # how the hosts find host 0 (Hosts.torchrun)


class HostsError(RuntimeError):
    """This machine cannot make hosts (not root, no network namespaces or veth pairs, a tool missing)."""


@dataclass(frozen=True)
class Host:
    index: int
    name: str                   # its hostname
    netns: str                  # its network namespace
    address: str                # its address on the link


class Hosts:
    def __init__(self, n: int, rate: str | None = None, prefix: str = "smh", cpus: list[list[int]] | None = None):
        """`n` hosts; `rate` each host's link (tc's units: "1gbit", "100mbit"; None: as fast as the kernel);
        `cpus` host i's processes pinned to the cores cpus[i] (None: every core, shared by all hosts)."""
        if n < 1:
            raise ValueError(f"hosts: n must be at least 1, got {n}")
        if cpus is not None and (len(cpus) != n or not all(set(c) <= os.sched_getaffinity(0) and c for c in cpus)):
            raise ValueError(f"hosts: cpus must give {n} non-empty lists of this process's cores "
                             f"{sorted(os.sched_getaffinity(0))}, got {cpus}")
        self.n, self.rate, self.cpus = n, rate, cpus
        self.id = f"{prefix}{uuid.uuid4().hex[:6]}"
        block = int(self.id[-4:], 16) % 250 + 1
        self.switch = f"{self.id}-sw"
        self.hosts = [Host(i, f"host{i}", f"{self.id}-{i}", SUBNET.format(block=block, host=i + 1))
                      for i in range(n)]
        self.made: list[str] = []
        self.started: list[subprocess.Popen] = []      # killed at close with their process groups
        self.files: tempfile.TemporaryDirectory | None = None     # each host's /etc/hosts

    # -- making and removing them ------------------------------------------------------------
    def __enter__(self) -> "Hosts":
        check_machine()
        try:
            self.files = tempfile.TemporaryDirectory(prefix=f"{self.id}-")
            for h in self.hosts:
                names = [f"{o.address} {o.name}" for o in self.hosts if o is not h]
                Path(self.files.name, h.name).write_text("\n".join(["127.0.0.1 localhost", f"127.0.1.1 {h.name}",
                                                                    *names]) + "\n")
            self._netns(self.switch)
            self._ip(self.switch, "link add br0 type bridge", "link set br0 up")
            for h in self.hosts:
                self._netns(h.netns)
                ip("link", "add", "eth0", "netns", h.netns, "type", "veth", "peer", "name", f"p{h.index}",
                   "netns", self.switch)
                self._ip(self.switch, f"link set p{h.index} master br0", f"link set p{h.index} up")
                self._ip(h.netns, "link set lo up", f"addr add {h.address}/24 dev eth0", "link set eth0 up")
                if self.rate:
                    ns_run(h.netns, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", self.rate,
                                     "burst", "256kb", "latency", "100ms"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process on the hosts (those started here with their process groups, which may not have
        entered their namespace yet), then remove the namespaces."""
        for proc in self.started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.started = []
        for netns in reversed(self.made):
            for pid in namespace_pids(netns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self.made = []
        if self.files is not None:
            self.files.cleanup()
            self.files = None

    def _netns(self, name: str) -> None:
        ip("netns", "add", name)
        self.made.append(name)

    @staticmethod
    def _ip(netns: str, *commands: str) -> None:
        for command in commands:
            ns_run(netns, ["ip", *command.split()])

    # -- using them -------------------------------------------------------------------------------
    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def command(self, i: int, argv: list[str]) -> list[str]:
        """`argv` as host i runs it: in its network namespace, under its hostname, with its own /dev/shm."""
        h = self.hosts[i]
        if self.cpus is not None:
            argv = ["taskset", "-c", ",".join(map(str, self.cpus[i])), *argv]
        names = shlex.quote(str(Path(self.files.name, h.name)))
        inner = f"hostname {h.name} && mount -t tmpfs tmpfs /dev/shm && mount --bind {names} /etc/hosts && " \
                f"exec {shlex.join(argv)}"
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", inner]

    def start(self, i: int, argv: list[str], **popen) -> subprocess.Popen:
        """`argv` started on host i (a Popen: stdout and stderr as `popen` says), in a process group of its own."""
        proc = subprocess.Popen(self.command(i, argv), start_new_session=True, **popen)
        self.started.append(proc)
        return proc

    def run(self, i: int, argv: list[str], timeout: float = 60) -> str:
        """`argv` run on host i to its end: its stdout, or a HostsError with its stderr."""
        done = subprocess.run(self.command(i, argv), capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise HostsError(f"host{i}: {shlex.join(argv)} exited with {done.returncode}: {done.stderr[-500:]}")
        return done.stdout

    def torchrun(self, argv: list[str], port: int = 29500, timeout: float = 300, hosts: range | None = None,
                 rendezvous: str = "address") -> list[subprocess.CompletedProcess]:
        """`python -m torch.distributed.run ... ARGV` on every host at once, one process each, host 0 holding the
        rendezvous (as `torchrun --nnodes N --node-rank R --master-addr HOST0` on N real machines); each host's
        result, in order. `rendezvous`: "address" (--master-addr host 0's address), "name" (its name, which host 0
        itself resolves to 127.0.1.1) or "c10d" (torchrun's c10d rendezvous at host 0's name: the agents then name
        their hosts to each other)."""
        procs = self.start_torchrun(argv, port, hosts, rendezvous=rendezvous)
        results = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return results

    def start_torchrun(self, argv: list[str], port: int = 29500, hosts: range | None = None,
                       join_s: float = JOIN_S, rendezvous: str = "address") -> list[subprocess.Popen]:
        """torchrun's processes started on `hosts` (default: all), one a host (stdout and stderr piped, as text),
        for a job of every host: one that does not join within `join_s` fails them all."""
        if rendezvous not in RENDEZVOUS:
            raise ValueError(f"hosts: rendezvous must be one of {', '.join(RENDEZVOUS)}, got {rendezvous!r}")
        head = self.hosts[0].address if rendezvous == "address" else self.hosts[0].name
        meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head}:{port}", "--rdzv-id", self.id] \
            if rendezvous == "c10d" else ["--master-addr", head, "--master-port", str(port)]
        return [self.start(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.n),
                               "--node-rank", str(i), "--nproc-per-node", "1", *meet, "--rdzv-conf",
                               f"timeout={join_s:g}", *argv],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in (hosts if hosts is not None else range(self.n))]

    def link(self, i: int, up: bool) -> None:
        """Host i's link set up or down (as a cable pulled: its processes see silence, not a reset)."""
        self._ip(self.switch, f"link set p{i} {'up' if up else 'down'}")

    def pids(self, i: int) -> list[int]:
        """The processes running on host i."""
        return namespace_pids(self.hosts[i].netns)


def check_machine() -> None:
    """A HostsError saying what this machine lacks to make hosts, or nothing."""
    if os.geteuid() != 0:
        raise HostsError("making hosts needs root (network namespaces and veth pairs): run as root")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise HostsError(f"making hosts needs {', '.join(missing)}: install iproute2 and util-linux")


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise HostsError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def ns_run(netns: str, argv: list[str]) -> None:
    ip("netns", "exec", netns, *argv)


def namespace_pids(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]
