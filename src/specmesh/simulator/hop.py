"""The one-way time of a small message between two hosts through the runtime's link (its sockets), for the
simulator's `link_ms`: `python -m specmesh.simulator.hop` on each host under torchrun; rank 0 prints the median in ms.
`across_hosts()` runs it on two hosts that bench/hosts.py makes on this machine."""
from __future__ import annotations

import time

import numpy as np
import torch

REPS, WARMUP = 300, 30


def ping_pong(link, x: torch.Tensor, reps: int) -> list[float]:
    """`reps` round trips of `x` between ranks 0 and 1 of `link` (rank 1 sends back what it got): each one's
    seconds."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        if link.rank == 0:
            link.send(x, 1)
            link.recv(x, 1)
        else:
            link.recv(x, 0)
            link.send(x, 0)
        times.append(time.perf_counter() - start)
    return times


def one_way_ms(times: list[float], warmup: int = WARMUP) -> float:
    """Half the median round trip after `warmup`, in ms."""
    return float(np.median(times[warmup:])) * 1e3 / 2


def main() -> None:
    from specmesh.runtime.link import join_env
    link = join_env(["stage0", "stage1"], 60.0)
    times = ping_pong(link, torch.zeros(2, dtype=torch.int64), REPS + WARMUP)
    if link.rank == 0:
        print(f"{one_way_ms(times):.5f}")
    link.close()


def across_hosts() -> float:
    """link_ms measured between two namespaced hosts here (needs root: bench/hosts.py)."""
    from specmesh.bench.hosts import Hosts
    with Hosts(2) as hosts:
        results = hosts.torchrun(["-m", "specmesh.simulator.hop"], timeout=120)
    if results[0].returncode:
        raise RuntimeError(f"measuring the hop between hosts failed: {results[0].stderr[-800:]}")
    return float(results[0].stdout.split()[-1])


if __name__ == "__main__":
    main()
