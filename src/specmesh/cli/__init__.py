"""specmesh command line: generate | tune | models | bench | serve | loadtest | simulate | ngram | train.

One module per group of commands, each with `add(sub)` (its parser) and its `cmd_*` functions; args.py holds what
they share. The parser is built from options.py's declarations alone: `specmesh --help` loads no torch."""
from __future__ import annotations

import gc
import os
import sys
import warnings

from specmesh.cli import bench, generate, serve, train
from specmesh.cli.args import EXIT_USAGE, Parser, take_named_prompt

COMMANDS = {"generate": generate.cmd_generate, "tune": generate.cmd_tune, "models": generate.cmd_models,
            "bench": bench.cmd_bench, "loadtest": bench.cmd_loadtest, "simulate": bench.cmd_simulate,
            "serve": serve.cmd_serve, "ngram": train.cmd_ngram, "train": train.cmd_train}


def build_parser() -> Parser:
    parser = Parser(prog="specmesh", description="Lossless speculative decoding for Llama-family models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (generate, bench, serve, train):
        group.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    if unknown:                                  # named by the subcommand, as its other errors are
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")
    take_named_prompt(args, sub)
    from specmesh.runtime import PeerError
    warnings.showwarning = lambda message, *_, **__: print(f"{sub.prog}: warning: {message}", file=sys.stderr)
    try:
        if getattr(args, "dtype", None) == "auto" and args.command != "bench":     # bench measures each method's
            from specmesh.llm import default_dtype, resolve_device                  # (every torchrun rank alike)
            args.dtype = default_dtype(resolve_device(args.device))
        if args.command in ("generate", "tune", "serve") and args.threads:     # bench keeps it per method
            from specmesh.timing import chosen_threads
            with chosen_threads(args.threads):
                return COMMANDS[args.command](args, sub)
        return COMMANDS[args.command](args, sub)
    except (ValueError, FileNotFoundError) as e:
        sub.exit(EXIT_USAGE, f"{sub.prog}: error: {e}\n")
    except PeerError as e:
        sub.exit(1, f"{sub.prog}: error: {e}\n")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:                     # `specmesh generate ... | head`: the reader is gone, so is the output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def run() -> None:
    """The `specmesh` command: main(), the collector's youngest generation taking 50,000 objects rather than 700
    (starting up makes about a million that live as long as the process, torch's and the model's: hundreds of
    passes over them, a tenth of a second or more before the first token), then the process's end without the
    collector's last pass over every object that Python's exit makes: those are freed with the process."""
    gc.set_threshold(50_000, 10, 10)
    code = main()
    gc.freeze()
    sys.exit(code)

