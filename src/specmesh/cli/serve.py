"""serve: the OpenAI-compatible HTTP server."""
from __future__ import annotations

from pathlib import Path

from specmesh.cli.args import (AUTO_DTYPE, DTYPE_CHOICES, add_method_options, add_model_args, add_tune,
                               method_options, warn_unused)
from specmesh.cli.ranks import serve_if_not_rank_0
from specmesh.options import CARDS, port, positive_int, seconds


def add(sub) -> None:
    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching")
    v.add_argument("--method", default="auto", choices=["auto", *CARDS],
                   help="decoding method (default: auto, as in generate)")
    v.add_argument("--methods", metavar="M,M", default=None,
                   help="methods a request may choose with its `method` field, all in one batch (of "
                        "ar, sd, tree, easyspec, selfdraft, suffix; default: --method alone, which is then their "
                        "first unless given)")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    v.add_argument("--port", type=port, default=8000)
    v.add_argument("--model-name", default=None, help="the model id clients send (default: the target's name, "
                   "e.g. specmesh-target or smollm2-135m-instruct)")
    v.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=AUTO_DTYPE)
    add_model_args(v, tp=True)
    add_tune(v)
    v.add_argument("--max-batch", type=positive_int, metavar="N",
                   help="requests decoded together (default: 16, fewer if their KV cache would pass --max-kv-mb)")
    v.add_argument("--max-kv-mb", type=float, metavar="MB",
                   help="bound on the KV cache of the running requests (default: a quarter of the memory available "
                        "at start); a --max-batch past it is refused")
    v.add_argument("--grace", type=seconds, default=30.0, metavar="SECONDS",
                   help="on SIGTERM, how long running requests may take to finish (default: 30)")
    v.add_argument("--prefix-cache-mb", type=float, default=256.0, metavar="MB",
                   help="memory for the keys and values of prompt prefixes served before, reused exactly "
                        "where the kernels allow (default: 256; 0: off)")
    v.add_argument("--max-n", type=positive_int, metavar="N",
                   help="samples per prompt one request may ask for (default: --max-batch); more: 400")
    v.add_argument("--max-queued", type=positive_int, metavar="N",
                   help="sequences that may wait for a free row (default: 16 x --max-batch); more: 429")
    v.add_argument("--prefill-chunk", type=positive_int, default=128, metavar="TOKENS",
                   help="a longer prompt is computed this many tokens per engine step, between the running "
                        "requests' steps (default: 128)")
    key = v.add_argument_group("access")
    key.add_argument("--api-key-file", type=Path, metavar="FILE",
                     help="every /v1 request must send `Authorization: Bearer KEY`, KEY the file's first line "
                          "(default: $SPECMESH_API_KEY, else no key; without one, serving on an address other than "
                          "loopback prints a warning)")
    key.add_argument("--api-key", metavar="KEY",
                     help="the key itself (visible to other users in the process list: prefer --api-key-file)")
    key.add_argument("--key-everywhere", action="store_true", help="/health and /metrics need the key too")
    add_method_options(v, list(CARDS))


def cmd_serve(args, parser) -> int:
    from specmesh.serve import ServeConfig, run
    if (code := serve_if_not_rank_0(args)) is not None:
        return code
    from specmesh.options import method_names
    try:
        names = method_names(args.methods)
    except ValueError as e:
        parser.error(str(e))
    warn_unused(args, names or [args.method])
    method = names[0] if names and args.method == "auto" else args.method
    return run(ServeConfig(method=method, methods=args.methods, host=args.host, port=args.port, model_name=args.model_name,
                           dtype=args.dtype, target=args.target, draft=args.draft, device=args.device, quant=args.quant,
                           tp=args.tp, max_batch=args.max_batch, max_kv_mb=args.max_kv_mb, options=method_options(args),
                           grace_s=args.grace,
                           max_n=args.max_n, max_queued=args.max_queued, prefill_chunk=args.prefill_chunk,
                           prefix_cache_mb=args.prefix_cache_mb, tune=not args.no_tune, api_key=api_key(args, parser),
                           key_everywhere=args.key_everywhere))


def api_key(args, parser) -> str | None:
    """--api-key, else --api-key-file's first line, else $SPECMESH_API_KEY, else None."""
    from specmesh.settings import settings
    if args.api_key is not None and args.api_key_file is not None:
        parser.error("give one of --api-key and --api-key-file")
    if args.api_key_file is not None:
        try:
            key = next(iter(args.api_key_file.read_text().splitlines()), "").strip()
        except OSError as e:
            parser.error(f"argument --api-key-file: {args.api_key_file}: {e.strerror}")
        if not key:
            parser.error(f"argument --api-key-file: {args.api_key_file} holds no key on its first line")
        return key
    key = args.api_key if args.api_key is not None else settings().api_key
    if key is not None and not key.strip():
        parser.error("the API key is empty")
    if args.key_everywhere and key is None:
        parser.error("--key-everywhere needs a key (--api-key-file, --api-key or $SPECMESH_API_KEY)")
    return key
