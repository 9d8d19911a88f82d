"""Under torchrun every rank runs the same command: rank 0 decodes, the ranks after it serve what the method asks
of them (pearl's draft rank, a pipeline's stages, cosine's drafters, a tensor-parallel target's shards)."""
from __future__ import annotations

import os


def serve_torchrun_rank(args) -> int:
    """Under torchrun every rank runs the same command; the ranks after 0 serve: pearl's draft rank,
    a pipeline's stages."""
    import torch
    from specmesh import catalog
    from specmesh.options import CARDS
    from specmesh.proposers import remote_chain
    from specmesh.methods.pipeline.stages import StageServer
    from specmesh.runtime import pipeline
    from specmesh.runtime.link import join_env
    device = args.device
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    timeout = args.timeout or CARDS[args.method].defaults["timeout"]
    torch.set_num_threads(1)
    if args.method == "cosine":
        return serve_drafter_rank(args, device, timeout)
    if args.method == "pearl":
        draft = catalog.required_draft(catalog.resolve(args.target), args.draft, "pearl")
        config = {"draft": str(draft), "dtype": args.dtype, "quant": args.quant, "device": device}
        remote_chain.DraftServer(config).run(join_env(remote_chain.ROLES, timeout))
        return 0
    config = {"target": str(catalog.resolve(args.target)), "dtype": args.dtype, "quant": args.quant,
              "device": device}
    roles = pipeline.roles(args.stages or 2, args.method != "pp", bool(args.draft_apart))
    StageServer(config).run(join_env(roles, timeout))
    return 0


def serve_drafter_rank(args, device: str, timeout: float) -> int:
    """cosine --drafter-processes: rank n serves drafter n of the target's (or --drafters') list."""
    from specmesh import catalog
    from specmesh.proposers.remote_drafter import DrafterServer, roles
    from specmesh.runtime.link import join_env
    paths, _ = catalog.drafters_for(catalog.resolve(args.target), args.drafters or "")
    config = {"drafters": [str(p) for p in paths], "dtype": args.dtype, "quant": args.quant, "device": device}
    DrafterServer(config).run(join_env(roles(len(paths)), timeout))
    return 0


def serve_tp_rank(args) -> int:
    """Under torchrun with --tp N every rank runs the same command; the ranks after 0 keep their shard of the
    target and repeat rank 0's forwards."""
    from specmesh import catalog
    from specmesh.runtime import tensor_parallel
    from specmesh.runtime.link import join_env
    config = {"target": str(catalog.resolve(args.target)), "dtype": args.dtype, "quant": args.quant,
              "device": args.device, "world": args.tp}
    timeout = getattr(args, "timeout", None) or tensor_parallel.TIMEOUT_S
    tensor_parallel.Follower(config).run(join_env(tensor_parallel.roles(args.tp), timeout))
    return 0


def serve_if_not_rank_0(args) -> int | None:
    """Under torchrun, on a rank after 0 of a method with ranks of its own (a pipeline, pearl's draft, cosine's
    drafter processes, --tp): serve them, and the exit code; else None (rank 0, or no torchrun)."""
    if torchrun_rank() == 0:
        return None
    if args.tp > 1:
        return serve_tp_rank(args)
    from specmesh.methods import METHODS
    spec = METHODS.get(args.method)
    if spec is not None and (spec.start is not None or getattr(args, "drafter_processes", False)):
        return serve_torchrun_rank(args)
    return None


def torchrun_rank() -> int:
    from specmesh.runtime.link import under_torchrun
    return int(os.environ["RANK"]) if under_torchrun() else 0
