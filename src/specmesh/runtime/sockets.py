"""TCP connections between ranks on different hosts, for a link's small messages.

Through gloo a message between hosts waits for gloo's I/O thread on both ends, and a rank that computes on its
only core holds that thread off for a scheduler slice: a hop of a few tens of microseconds idle took most of a
millisecond inside a pipeline (docs/hosts.md). On a socket of its own the sender's thread writes the message into
the kernel's buffer and the receiver's thread reads it from its own when it gets there; the kernels carry it
meanwhile. A message of up to SOCKET_BYTES fits the buffers whole (SO_SNDBUF, SO_RCVBUF), so a send never waits
for its receiver, and two ranks sending to each other at once cannot block each other.

Waits are bounded: a recv with a timeout fails after it, and a recv without one (a rank idle between jobs) fails
when the kernel's keepalive probes go unanswered for about KEEPALIVE_S (a host gone, a link down), since a silent
link would otherwise be an endless wait.
"""
from __future__ import annotations

import select
import socket
import time

import torch.distributed as dist

SOCKET_BYTES = 1 << 16          # the largest message sent on a socket (larger ones go through gloo)
BUFFER_BYTES = 1 << 21          # each socket's kernel buffers, both ways
KEEPALIVE = (4, 2, 3)           # idle seconds before the first probe, seconds between probes, probes unanswered
KEEPALIVE_S = KEEPALIVE[0] + KEEPALIVE[1] * KEEPALIVE[2]
CONNECT_S = 30.0


class Silent(OSError):
    """The peer sent nothing within the wait's bound."""


class Sockets:
    """This rank's connections to the ranks on other hosts (`hosts[r]`: rank r's hostname). Every rank listens on
    `address` (its address towards the rendezvous) and says where in the store; the higher rank of a pair connects
    to the lower and names itself in 4 bytes."""

    def __init__(self, store: dist.Store, rank: int, hosts: list[str], address: str):
        others = [r for r in range(len(hosts)) if hosts[r] != hosts[rank]]
        self.peers: dict[int, socket.socket] = {}
        with socket.create_server((address, 0)) as listener:
            store.set(f"sock/{rank}", f"{address} {listener.getsockname()[1]}")
            for r in (r for r in others if r < rank):
                host, port = store.get(f"sock/{r}").decode().split()
                conn = socket.create_connection((host, int(port)), timeout=CONNECT_S)
                conn.sendall(rank.to_bytes(4, "little"))
                self.peers[r] = conn
            listener.settimeout(CONNECT_S)
            for _ in (r for r in others if r > rank):
                conn, _ = listener.accept()
                conn.settimeout(CONNECT_S)
                self.peers[int.from_bytes(read_exactly(conn, 4), "little")] = conn
        for conn in self.peers.values():
            configure(conn)

    def __contains__(self, peer: int) -> bool:
        return peer in self.peers

    def send(self, peer: int, data: memoryview) -> None:
        self.peers[peer].sendall(data)

    def recv_into(self, peer: int, out: memoryview, timeout_s: float | None) -> None:
        """Fill `out` from `peer`: within `timeout_s` (None: as long as the connection lives), else Silent; a
        connection that closed or failed is a ConnectionError or OSError."""
        conn, got, deadline = self.peers[peer], 0, None if timeout_s is None else time.monotonic() + timeout_s
        while got < len(out):
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([conn], [], [], left)[0]:
                    raise Silent(f"nothing within {timeout_s:g} s")
            n = conn.recv_into(out[got:])
            if n == 0:
                raise ConnectionError("Connection closed by peer")
            got += n

    def close(self) -> None:
        for conn in self.peers.values():
            conn.close()
        self.peers = {}


def configure(conn: socket.socket) -> None:
    """Blocking, no Nagle delay, buffers for a whole message, keepalive probes that find a silent peer."""
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    if hasattr(socket, "TCP_KEEPIDLE"):                 # Linux
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    if hasattr(socket, "TCP_USER_TIMEOUT"):             # unacknowledged data fails in the same time
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, KEEPALIVE_S * 1000)


def read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("Connection closed by peer")
        data += chunk
    return data
