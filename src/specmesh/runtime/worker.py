"""Entry point of a launched worker process: `python -m specmesh.runtime.worker`.

The launcher (specmesh.runtime.link.launch) passes the rendezvous in MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE, and what to serve in SPECMESH_WORKER (JSON): the
ranks' roles, the launcher's pid, `serve` ("module:Class", built from the config,
which loads its model before the rank reports ready, then `.run(link)`), `timeout`
and `threads`. A worker dies with its launcher (PR_SET_PDEATHSIG) and exits when
another rank stops answering.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import sys


def die_with_parent(parent: int) -> None:
    """Linux: have the kernel kill this process when its launcher dies (checked once here, as
    the launcher may have died before the request was made)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(1)


def main() -> int:
    config = json.loads(os.environ["SPECMESH_WORKER"])
    die_with_parent(config["parent"])       # first: before the seconds that importing torch takes
    import torch
    from specmesh.runtime.link import PeerError, join_env
    torch.set_num_threads(config.get("threads", 1))
    rank, roles = int(os.environ["RANK"]), config["roles"]
    module, name = config["serve"].split(":")
    server = getattr(importlib.import_module(module), name)(config)
    try:
        server.run(join_env(roles, config["timeout"], config.get("lend", False)))
    except PeerError as e:
        print(f"specmesh rank {rank} ({roles[rank]}): {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
