"""specmesh command line: generate | tune | models | bench | serve | loadtest | simulate | ngram | train."""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import warnings
from pathlib import Path

from specmesh.options import natural, non_negative, port, positive_int, probability, seconds

EXIT_USAGE = 2


class Defaults(argparse.HelpFormatter):
    """Help that states each option's default where its text does not already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help, default = action.help or "", action.default
        if default is None or default is False or default == [] or default == argparse.SUPPRESS \
                or not action.option_strings or "default" in help:
            return help
        return f"{help} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (exit 2) and every default in the help."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=kwargs.pop("formatter_class", Defaults), **kwargs)

    def add_argument(self, *args, **kwargs):
        if kwargs.get("help") is None and kwargs.get("default") is not None:   # argparse shows no line without help
            kwargs["help"] = "default: %(default)s"
        return super().add_argument(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def logit_bias(text: str) -> tuple[int, float]:
    """--logit-bias ID=BIAS"""
    token, _, bias = text.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ID=BIAS (like 50256=-100), got {text!r}") from None


def device_counts(text: str) -> list[int]:
    """'2,4,8' -> [2, 4, 8] (positive integers)."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected device counts like 2,4,8, got {text!r}")
    return counts


DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16"]
AUTO_DTYPE = ("auto (the default): bfloat16 on a CPU where specmesh's bf16 kernels run (x86 with AVX2) or with "
              "native bf16, else float32; every method gives ar's tokens in either, and float32 is the exact reference")


def out_path(text: str) -> str:
    """An output file's path (--plot, --json), checked before any work: a file in a folder that exists."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder: give a file path")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no folder {str(path.parent)!r}")
    return text


IMAGES = {"png", "pdf", "svg", "svgz", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp", "pgf"}   # matplotlib's


def plot_path(text: str) -> str:
    """--plot's path: an out_path whose suffix names an image format matplotlib writes."""
    if Path(text).suffix.lower().lstrip(".") not in IMAGES:
        raise argparse.ArgumentTypeError(f"{text!r}: the suffix names the image format: .png, .svg, .pdf ...")
    return out_path(text)


def json_path(text: str) -> str:
    """--json's PATH: '-' (stdout) or an out_path."""
    return text if text == "-" else out_path(text)


def write_json(obj, dest: str | None) -> None:
    """--json: '-' means stdout, anything else a file path."""
    text = json.dumps(obj, indent=2) + "\n"
    if dest == "-":
        sys.stdout.write(text)
    else:
        Path(dest).write_text(text)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", nargs="?", const="-", metavar="PATH", type=json_path,
                   help="write JSON to PATH, or to stdout when no PATH is given")


def json_took_prompt(args) -> str:
    """A hint where no PROMPT came: `--json "text"` reads the text as its PATH."""
    path = getattr(args, "json", None)
    if args.prompt is not None or path in (None, "-"):
        return ""
    return f" (--json took {path!r} as its PATH: put the prompt before --json)"


def add_model_args(p: argparse.ArgumentParser, tp: bool = False) -> None:
    from specmesh.options import QUANTS
    p.add_argument("--target", metavar="MODEL", help="target: a name from `specmesh models`, a HuggingFace folder "
                   "or a GGUF file (default: smollm2-135m-instruct; `embedded`: the 28M pair shipped here)")
    p.add_argument("--draft", metavar="MODEL", help="draft, as --target (default: the draft made for the target, "
                   "when the method needs one)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default: cpu)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads in this process (default: all cores; a multi-process method: its share)")
    p.add_argument("--quant", choices=list(QUANTS), default=None,
                   help="int8 / int4: target and draft weights quantized at load, a scale per 32 (like GGUF's Q8_0 / "
                        "Q4_0); every method stays lossless against the quantized model (docs/quantization.md)")
    if tp:
        p.add_argument("--tp", type=positive_int, default=1, metavar="N",
                       help="split the target over N processes (tensor parallelism) for ar, sd, tree, easyspec, cosine "
                            "and selfdraft; launched here, or one rank per torchrun process (docs/tensor-parallel.md)")


def add_tune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-tune", action="store_true",
                   help="with --method auto and no calibration cached for this machine, pair and dtype: run this kind "
                        "of CPU's default (docs/tuning.md) instead of calibrating first (about 20 s, once)")


def tuned(llm, args) -> None:
    """auto's first run calibrates, as a step of its own (cached: later runs start at once); --no-tune: the default."""
    if llm.auto and llm.choice.default_for and not args.no_tune:
        print("auto: calibrating for this machine, pair and dtype, once (cached; --no-tune skips it)",
              file=sys.stderr, flush=True)
        llm.tune()


def option_help(name: str, methods: list[str] | None = None) -> str:
    """An option's help with the methods that have it and their defaults, from the declarations."""
    from specmesh.options import OPTIONS, having
    specs = [spec for spec in having(name) if methods is None or spec.name in methods]
    shown = [spec.name if OPTIONS[name].kind is bool or spec.defaults[name] == "" else
             f"{spec.name} {spec.defaults[name]}" for spec in specs]
    return f"{OPTIONS[name].help} ({', '.join(shown)})"


def add_method_options(p: argparse.ArgumentParser, methods: list[str] | None = None) -> None:
    """Method options, generated from methods/base.py's declarations: each applies to the methods that have
    it, with their defaults (`methods`: only these methods' options)."""
    from specmesh.options import CARDS, OPTIONS
    o = p.add_argument_group("method options (default: each method's tuned value, or the draft's own "
                             "where its folder has an options.json: docs/methods.md)")
    for name, option in OPTIONS.items():
        if methods is not None and not any(name in CARDS[m].defaults for m in methods):
            continue
        flag = "--" + name.replace("_", "-")
        if option.kind is bool:
            o.add_argument(flag, action="store_const", const=True, default=None, help=option_help(name, methods))
        else:
            kind = {int: positive_int if option.least else natural,
                    float: probability if option.most == 1 else non_negative}.get(option.kind, str)
            o.add_argument(flag, type=kind, metavar=option.metavar or "N",
                           help=option_help(name, methods))


def method_options(args) -> dict:
    from specmesh.options import OPTIONS
    return {k: getattr(args, k) for k in OPTIONS if getattr(args, k, None) is not None}


def warn_unused(args, names: list[str]) -> None:
    """A warning for each option given that none of the methods `names` uses (auto and the bench's peers: any may)."""
    from specmesh.options import CARDS
    specs = [CARDS.get(name.split("@")[0]) for name in names]
    if None in specs:
        return
    unused = [k for k in method_options(args) if not any(k in spec.defaults for spec in specs)]
    if args.draft is not None and not any(spec.needs_draft for spec in specs):
        unused.append("draft")
    for k in unused:
        warnings.warn(f"--{k.replace('_', '-')} does not apply to {', '.join(names)}: ignored")


def build_parser() -> Parser:
    from specmesh.options import CARDS, PEER_WEIGHTS, POLICIES, SERVED
    parser = Parser(prog="specmesh", description="Lossless speculative decoding for Llama-family models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    g = sub.add_parser("generate", help="generate text from a prompt (streams to the terminal)")
    g.add_argument("prompt", nargs="?", help="the prompt text")
    g.add_argument("--prompt-file", metavar="FILE", help="read the prompt verbatim from FILE ('-' for stdin)")
    g.add_argument("--chat", metavar="MESSAGE", help="a user message, through the model's chat template (the answer "
                   "ends at its end-of-turn token)")
    g.add_argument("--system", metavar="TEXT", help="with --chat: a system message before it")
    g.add_argument("--method", default="auto",
                   help=f"decoding method: auto, {', '.join(CARDS)} (default: auto, the fastest lossless method "
                        f"for this machine and pair, measured once and cached: specmesh tune)")
    add_model_args(g, tp=True)
    add_tune(g)
    g.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help=AUTO_DTYPE)
    g.add_argument("--max-new-tokens", type=positive_int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 (the default), or below 1e-5: greedy")
    g.add_argument("--top-k", type=int, default=0, help="0: off")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: draw from the fewest most likely "
                   "tokens whose probability reaches P (1: off)")
    g.add_argument("--seed", type=int, default=None, help="sample j of --n draws with SEED + j (default: a fresh "
                   "random seed)")
    g.add_argument("--n", type=positive_int, default=1, help="independent samples, decoded as one batch")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                   help="subtracted from a token's logit per earlier occurrence in the output (-2..2)")
    g.add_argument("--presence-penalty", type=float, default=0.0, metavar="P",
                   help="subtracted from a token's logit once it occurred in the output (-2..2)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="divides positive and multiplies negative logits of tokens in the prompt or output (1: off)")
    g.add_argument("--logit-bias", type=logit_bias, action="append", default=[], metavar="ID=BIAS",
                   help="add BIAS (-100..100) to token ID's logit (repeatable)")
    g.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="report each token's log-probability under the target and its K most likely alternatives "
                        "(in --json)")
    add_method_options(g)
    add_json(g)

    t = sub.add_parser("tune", help="measure which method is fastest on this machine for a model pair (--method auto)")
    t.add_argument("prompt", nargs="?", help="calibrate on this text (default: the shipped calibration prompts)")
    t.add_argument("--prompt-file", metavar="FILE", help="calibrate on the text of FILE ('-' for stdin)")
    add_model_args(t)
    t.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="the dtype to tune for (each is cached apart); " + AUTO_DTYPE)
    add_json(t)

    m = sub.add_parser("models", help="list the models known by name (embedded, installed packages)")
    add_json(m)

    b = sub.add_parser("bench", help="run methods side by side on the same prompts")
    b.add_argument("--methods", help="comma-separated methods (default: ar,hf; with --quant: ar, since transformers "
                   "runs no quantized weights)")
    b.add_argument("--prompts", metavar="FILE.jsonl", help="prompt file (default: prompts/chat-heldout.jsonl for a "
                   "target with a chat template, else prompts/stdlib-heldout.jsonl)")
    b.add_argument("--limit", type=positive_int, default=None, help="use the first K prompts (default: all)")
    b.add_argument("--max-new-tokens", type=positive_int, default=128)
    b.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="auto: specmesh's methods in generate's dtype (bfloat16 where its kernels run it), a peer "
                        "in the faster of float32 and bfloat16, measured at start-up")
    add_model_args(b, tp=True)
    b.add_argument("--peer-weights", choices=PEER_WEIGHTS, default="file",
                   help="the llama.cpp peers' weights: file, a GGUF target's own file as it is (a folder: as "
                        "same-precision); same-precision, a GGUF copy at specmesh's dtype or --quant "
                        "(bf16, f32, Q8_0, Q4_0)")
    add_method_options(b)
    add_json(b)
    b.add_argument("--plot", metavar="OUT.png", type=plot_path,
                   help="draw speedup and tokens per target forward per method")
    b.add_argument("--layer-similarity", action="store_true",
                   help="instead of timing methods: how fuzzy easyspec's layer groups of 2, 3 and 4 are for the draft "
                        "(mean cosine of a layer's exact input and attention output with the group's, on the prompts)")

    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching")
    v.add_argument("--method", default="auto", choices=["auto", *SERVED],
                   help="decoding method (default: auto, as in generate)")
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
    add_method_options(v, SERVED)

    lt = sub.add_parser("loadtest", help="load a running server with streaming completions; latency percentiles")
    lt.add_argument("--url", required=True, help="the server root, without /v1 (e.g. http://127.0.0.1:8000)")
    mode = lt.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests per second")
    mode.add_argument("--concurrency", type=positive_int, help="closed loop: this many clients")
    lt.add_argument("--duration", type=float, required=True, metavar="SECONDS", help="how long to send requests")
    lt.add_argument("--prompts", metavar="FILE.jsonl", help="prompt file (default: the shipped held-out set)")
    lt.add_argument("--max-tokens", type=positive_int, default=64)
    lt.add_argument("--model", help="model id to send (default: none; the server's own)")
    add_json(lt)

    sm = sub.add_parser("simulate", help="pipedec / pp / stpp on a virtual clock for N pipeline stages, easyspec / tree "
                        "for a target split over N devices, or cosine / sd / tree on a cluster (simulated)")
    sm.add_argument("prompt", nargs="?", help="the prompt text (or --prompts FILE)")
    sm.add_argument("--prompts", metavar="FILE.jsonl", help="prompt file (one JSON object with 'prompt' per line)")
    sm.add_argument("--limit", type=positive_int, default=None, help="use the first K prompts of --prompts")
    sm.add_argument("--method", choices=["pipedec", "pp", "stpp", "easyspec", "tree", "cosine", "sd"],
                    default="pipedec",
                    help="pipedec, pp, stpp: pipeline stages (--stages); easyspec, tree: a split target (--tp); "
                         "cosine, sd, tree with --concurrency: drafter nodes around a verification server")
    sm.add_argument("--concurrency", type=positive_int, metavar="N",
                    help="cosine / sd / tree: the prompts N at a time (a finished one's row goes to the next) on "
                         "CoSine's cluster, each method shown with sd's")
    sm.add_argument("--stages", type=positive_int, default=14, help="pipeline stages to simulate (default: 14)")
    sm.add_argument("--tp", type=device_counts, default=[2, 4, 8], metavar="N[,N...]",
                    help="easyspec / tree: devices the target is split over (default: 2,4,8); easyspec is shown next "
                         "to exact drafting of the same tree")
    sm.add_argument("--calibration", choices=POLICIES, default="round",
                    help="easyspec: its calibration policy in the real runs; the clock prices the exact reads each "
                         "policy makes (default: round, the method's)")
    sm.add_argument("--profile", default="gpu-cluster",
                    help="gpu-cluster (the paper's setting), local (measured here: the pipeline methods), or a JSON "
                         "file of the gpu-cluster profile's shape")
    sm.add_argument("--max-new-tokens", type=positive_int, default=128)
    sm.add_argument("--tree-width", type=positive_int,
                    help="w: nodes per tree layer (default: the paper's 32 on gpu-cluster, else pipedec's default)")
    sm.add_argument("--max-children", type=positive_int,
                    help="c: children per node (default: the paper's 16 on gpu-cluster, else pipedec's default)")
    sm.add_argument("--depth", type=positive_int,
                    help="stpp: levels of its static tree (default: 5 on gpu-cluster, else stpp's default)")
    sm.add_argument("--draft-window", type=positive_int, default=64,
                    help="prompt tokens the draft reads (default: 64, as the methods')")
    sm.add_argument("--target", metavar="DIR")
    sm.add_argument("--draft", metavar="DIR")
    sm.add_argument("--drafters", metavar="DIR,DIR", help="cosine: its drafters (default: the target's shipped ones)")
    sm.add_argument("--calibrate", metavar="OUT.json", nargs="?", const="",
                    help="measure this machine's costs into a profile (default: the `local` profile, "
                         "models/profile-local.json of the checkout) and exit")
    sm.add_argument("--plot", metavar="OUT.png", type=plot_path,
                    help="simulate all three methods at 7, 14 and 21 stages and plot ms per token against depth")
    add_json(sm)

    n = sub.add_parser("ngram", help="n-gram caches for selfdraft")
    nsub = n.add_subparsers(dest="ngram_command", required=True, parser_class=Parser)
    nb = nsub.add_parser("build", help="count n-grams over a corpus into a corpus cache (.npz)")
    nb.add_argument("--corpus", required=True, metavar="DIR", help="folder of text files (*.py, *.txt, *.md)")
    nb.add_argument("--out", required=True, metavar="FILE", type=out_path, help="the cache file to write (.npz)")
    nb.add_argument("--tokenizer", metavar="MODEL", help="the model whose tokenizer counts the n-grams, as --target "
                    "(default: the default target, smollm2-135m-instruct); the cache serves only models with it")
    nb.add_argument("--gram", type=positive_int, default=4, help="n-gram size G: continuations of G-1 tokens")
    nb.add_argument("--skip-heldout", action="store_true",
                    help="the embedded models' training split: .py files outside the stdlib held-out rule")

    t = sub.add_parser("train", help="train the embedded tokenizer, target and draft (the shipped recipe), or with "
                       "--teacher a draft for that model")
    t.add_argument("--specialise", choices=["tests", "lib"], metavar="DOMAIN",
                   help="a cosine drafter: the embedded draft distilled further on one domain of the standard library, "
                        "tests or lib, into models/drafters/DOMAIN (about 16 minutes on 2 cores; docs/cosine.md)")
    t.add_argument("--teacher", metavar="MODEL", help="distill a draft for this target (a name, folder or GGUF): "
                   "its answers to generated instructions and standard-library code (docs/models.md)")
    t.add_argument("--steps", type=positive_int, default=1600, help="with --teacher: distillation steps (default: 1600, "
                   "about 70 minutes on 2 cores, after about 35 minutes of the teacher answering and continuing code)")
    t.add_argument("--lr", type=float, default=2e-3, help="with --teacher: peak learning rate (default: 2e-3; the "
                   "shipped draft went on from --init at 1e-3)")
    t.add_argument("--init", metavar="DIR", help="with --teacher or --specialise: go on distilling this draft (a "
                   "folder) instead of a fresh one (--teacher) or the general draft (--specialise)")
    t.add_argument("--work", default=None, help="scratch folder: corpus, checkpoints (default: runs/train, or "
                   "runs/distill with --teacher)")
    t.add_argument("--out", default=None, help="where the finished models go (default: models, or "
                   "models/smollm2-draft with --teacher)")
    t.add_argument("--tokens", type=positive_int, default=6_000_000, help="co-training tokens (default: 6M)")
    t.add_argument("--distill-tokens", type=positive_int, default=4_000_000,
                   help="draft-only distillation tokens after co-training (default: 4M)")
    t.add_argument("--resume-from", metavar="DIR",
                   help="models folder (target/, draft/) of a finished co-training: run only the distillation")
    t.add_argument("--threads", type=positive_int, default=None)
    return parser


def read_prompt(args, parser) -> str:
    if (args.prompt is None) == (args.prompt_file is None):
        parser.error("give exactly one of PROMPT, --prompt-file" + (" or --chat" if hasattr(args, "chat") else "")
                     + json_took_prompt(args))
    if args.prompt_file is None:
        return args.prompt
    if args.prompt_file == "-":
        name, data = "(stdin)", sys.stdin.buffer.read()
    else:
        name = Path(args.prompt_file)
        if not name.exists():
            raise FileNotFoundError(f"prompt file not found: {name}")
        if name.is_dir():
            raise ValueError(f"prompt file {name} is a folder")
        data = name.read_bytes()
    from specmesh.bench.prompts import utf8
    return utf8(data, name)                         # verbatim: no newline translation (a pipe's bytes too)


def serve_torchrun_rank(args) -> int:
    """Under torchrun every rank runs the same command; the ranks after 0 serve: pearl's draft rank,
    a pipeline's stages."""
    import torch
    from specmesh import catalog
    from specmesh.methods import METHODS
    from specmesh.proposers import remote_chain
    from specmesh.methods.pipeline.stages import StageServer
    from specmesh.runtime import pipeline
    from specmesh.runtime.link import join_env
    device = args.device
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    timeout = args.timeout or METHODS[args.method].defaults["timeout"]
    torch.set_num_threads(1)
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


def torchrun_rank() -> int:
    from specmesh.runtime.link import under_torchrun
    return int(os.environ["RANK"]) if under_torchrun() else 0


def checked_prompt(args, text: str | None) -> str:
    """The prompt: `text`, or --chat (and --system) rendered through the target's chat template; its errors
    (empty, past the target's context, a chat for a model without a template) come before the models load
    and `auto` measures (up to a minute the first time): this needs the tokenizer and config alone."""
    from specmesh import catalog
    from specmesh.engine.engine import check_prompt
    from specmesh.model.loader import load_tokenizer, read_config
    path = catalog.resolve(args.target)
    tokenizer = load_tokenizer(path)
    if args.chat is not None:
        system = [{"role": "system", "content": args.system}] if args.system is not None else []
        text = tokenizer.render_chat(system + [{"role": "user", "content": args.chat}])
    config = read_config(path)                              # a folder's or a GGUF file's
    check_prompt(tokenizer.encode(text) if text else [], config.max_position_embeddings, config.vocab_size)
    return text


def cmd_generate(args, parser) -> int:
    from specmesh import LLM, SamplingParams
    from specmesh.methods import METHODS
    spec = METHODS.get(args.method)
    if torchrun_rank() > 0 and args.tp > 1:
        return serve_tp_rank(args)
    if spec is not None and spec.start is not None and torchrun_rank() > 0:
        return serve_torchrun_rank(args)
    if args.chat is None and args.system is not None:
        parser.error("--system goes with --chat")
    if args.chat is not None and (args.prompt is not None or args.prompt_file is not None):
        parser.error("give exactly one of PROMPT, --prompt-file or --chat")
    prompt = checked_prompt(args, read_prompt(args, parser) if args.chat is None else None)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, n=args.n, stop=args.stop, logprobs=args.logprobs,
                            frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
                            repetition_penalty=args.repetition_penalty, logit_bias=dict(args.logit_bias))
    if spec is not None:
        spec.check_params(params)                           # before a multi-process method starts its processes
    warn_unused(args, [args.method])
    llm = LLM(target=args.target, draft=args.draft, method=args.method, device=args.device, dtype=args.dtype,
              quant=args.quant, tp=args.tp, **method_options(args))
    stream = args.json != "-"
    with llm:
        tuned(llm, args)
        run = llm.stream(prompt, params, progress=params.n > 1)     # the other samples: count them
        if stream and params.n > 1:
            sys.stdout.write(f"--- sample 1 of {params.n} ---\n")
        for piece in run:
            if stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
    out = run.output
    if stream:
        sys.stdout.write("\n")
        for i, sample in enumerate(out.samples[1:], 2):      # the others, once all are done
            sys.stdout.write(f"--- sample {i} of {params.n} ---\n{sample.text}\n")
    s = out.stats
    per = (f"{s.generated_tokens / s.timesteps:.2f} tokens/timestep" if s.timesteps else
           f"{s.tokens_per_forward or 0:.2f} tokens/target forward")
    hits = f", hit rate {s.hits / s.decisions:.2f}" if s.decisions else ""
    used = llm.method_for([llm.encode(prompt)])                   # auto may choose by the prompt's kind
    print(f"[{used.name}, {args.dtype}] {s.generated_tokens} tokens in {s.elapsed_s:.2f}s, "
          f"{s.tokens_per_s or 0:.1f} tok/s, {per}{hits}", file=sys.stderr)
    if args.json:
        chose = llm.choice is not None and llm.choice.candidates       # auto, with something to choose from
        write_json(out.to_json() | ({"auto": llm.choice.to_json()} if chose else {}), args.json)
    return 0


def cmd_tune(args, parser) -> int:
    from specmesh import LLM
    given = args.prompt is not None or args.prompt_file is not None
    llm = LLM(target=args.target, draft=args.draft, method="auto", device=args.device, dtype=args.dtype,
              quant=args.quant)
    choice = llm.tune([read_prompt(args, parser)] if given else None, remeasure=True)
    table = sys.stderr if args.json == "-" else sys.stdout
    for c in choice.candidates:
        opts = " ".join(f"{k}={v}" for k, v in c.options.items())
        print(f"{c.method:10} {opts:40} {c.ms_per_token:6.2f} ms/token  {c.reason}", file=table)
    if args.json:
        write_json(choice.to_json(), args.json)
    return 0


def cmd_models(args, parser) -> int:
    from specmesh import catalog
    from specmesh.model.gguf_file import parameter_count
    rows = [{"name": m.name, "role": m.role, "parameters": parameter_count(m.path) if m.path.exists() else None,
             "path": str(m.path), "source": m.source, "draft": m.draft} for m in catalog.known().values()]
    if args.json:
        write_json(rows, args.json)
    else:
        for r in rows:
            paired = f"  (draft: {r['draft']})" if r["draft"] else ""
            size = "  (made on first use)" if r["parameters"] is None else f"{r['parameters'] / 1e6:7.2f}M"
            print(f"{r['name']:22} {r['role']:6} {size}  {r['source']}{paired}\n"
                  f"{'':22} {r['path']}")
        print(f"{catalog.EMBEDDED:22} alias   specmesh-target (specmesh-draft as --draft)")
    return 0


def cmd_bench(args, parser) -> int:
    from specmesh.bench.runner import BenchConfig, run_bench
    from specmesh.bench.report import print_table
    methods = [m.strip() for m in (args.methods or ("ar" if args.quant else "ar,hf")).split(",") if m.strip()]
    if not methods:
        parser.error("--methods is empty")
    warn_unused(args, methods)
    if args.layer_similarity:
        from specmesh.bench.similarity import print_similarity, similarity_table
        result = similarity_table(args.target, args.draft, args.prompts, args.limit)
        print_similarity(result, file=sys.stderr if args.json == "-" else sys.stdout)
        if args.json:
            write_json(result, args.json)
        return 0
    cfg = BenchConfig(methods=methods, prompts=args.prompts, limit=args.limit, max_new_tokens=args.max_new_tokens,
                      dtype=args.dtype, threads=args.threads, target=args.target, draft=args.draft, quant=args.quant,
                      device=args.device, tp=args.tp, peer_weights=args.peer_weights, options=method_options(args))
    result = run_bench(cfg)
    print_table(result, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        write_json(result, args.json)
    if args.plot:
        from specmesh.bench.report import plot
        plot(result, args.plot)
    return 0


def cmd_serve(args, parser) -> int:
    from specmesh.serve import ServeConfig, run
    if torchrun_rank() > 0 and args.tp > 1:
        return serve_tp_rank(args)
    warn_unused(args, [args.method])
    return run(ServeConfig(method=args.method, host=args.host, port=args.port, model_name=args.model_name,
                           dtype=args.dtype, target=args.target, draft=args.draft, device=args.device, quant=args.quant,
                           tp=args.tp, max_batch=args.max_batch, max_kv_mb=args.max_kv_mb, options=method_options(args),
                           grace_s=args.grace,
                           max_n=args.max_n, max_queued=args.max_queued, prefill_chunk=args.prefill_chunk,
                           prefix_cache_mb=args.prefix_cache_mb, tune=not args.no_tune))


def cmd_loadtest(args, parser) -> int:
    from specmesh.bench.prompts import load_prompts
    from specmesh.bench.loadtest import LoadConfig, print_summary, run
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    if args.duration <= 0:
        parser.error("--duration must be positive")
    cfg = LoadConfig(url=args.url, rate=args.rate, concurrency=args.concurrency, duration=args.duration,
                     prompts=load_prompts(args.prompts), max_tokens=args.max_tokens, model=args.model)
    summary, errors = run(cfg)
    print_summary(summary, sys.stderr if args.json == "-" else sys.stdout)
    for message in errors[:5]:
        print(f"error: {message}", file=sys.stderr)
    if args.json:
        write_json(summary, args.json)
    return 1 if summary["requests"] and summary["errors"] == summary["requests"] else 0     # none got through


def cmd_simulate(args, parser) -> int:
    from specmesh.bench.prompts import load_prompts
    from specmesh.bench.simulate import LOCAL, Profile, SimConfig, calibrate, simulate
    if args.calibrate is not None:
        out = Path(args.calibrate) if args.calibrate else LOCAL
        profile = calibrate(out)
        print(f"{out}: a target layer {profile['stage']['layer_ms'][0]:.2f} ms per token, "
              f"hop {profile['hop_ms']:.3f} ms", file=sys.stderr)
        return 0
    if (args.prompt is None) == (args.prompts is None):
        parser.error("give exactly one of PROMPT or --prompts FILE" + json_took_prompt(args))
    prompts = [args.prompt] if args.prompt is not None else load_prompts(args.prompts, args.limit)
    if args.method in ("cosine", "sd") or args.concurrency:
        from specmesh.bench.simulate_cosine import ClusterProfile, print_cluster, simulate_cluster
        methods = [args.method] + [m for m in ("sd",) if m != args.method]
        result = simulate_cluster(methods, args.concurrency or 8, ClusterProfile.load(args.profile), prompts,
                                  args.max_new_tokens, args.target, args.draft, args.drafters)
        print_cluster(result, sys.stderr if args.json == "-" else sys.stdout)
        if args.json:
            write_json(result, args.json)
        return 0
    if args.method in ("easyspec", "tree"):
        from specmesh.bench.simulate_tp import TPProfile, print_tp, simulate_tp
        result = simulate_tp(args.method, args.tp, TPProfile.load(args.profile), prompts, args.max_new_tokens,
                             args.target, args.draft, args.calibration)
        print_tp(result, sys.stderr if args.json == "-" else sys.stdout)
        if args.json:
            write_json(result, args.json)
        return 0
    from specmesh.methods import METHODS
    pipedec, stpp = METHODS["pipedec"].defaults, METHODS["stpp"].defaults
    paper = args.profile == "gpu-cluster"
    cfg = SimConfig(args.method, args.stages, Profile.load(args.profile), args.max_new_tokens,
                    args.tree_width or (32 if paper else pipedec["tree_width"]),
                    args.max_children or (16 if paper else pipedec["max_children"]),
                    args.depth or (5 if paper else stpp["gamma"]), args.draft_window, args.target, args.draft)
    if args.plot:
        from specmesh.bench.simulate import sweep_plot
        table = sweep_plot(cfg, prompts, args.plot)
        for method, ms in table["ms_per_token"].items():
            print(f"[simulated] {method:8} " + "  ".join(f"{n} stages {v:7.2f} ms/token"
                                                         for n, v in zip(table["stages"], ms)), file=sys.stderr)
        if args.json:
            write_json(table, args.json)
        return 0
    result = simulate(cfg, prompts)
    print(f"[simulated, profile {result['profile']}] {args.method} on {args.stages} stages: "
          f"{result['ms_per_token']:.2f} ms/token, {result['tokens_per_s']:.1f} tokens/s, "
          f"{result['tokens_per_timestep']:.3f} tokens/timestep"
          + (f", hit rate {result['hit_rate']:.3f}" if result["hit_rate"] is not None else ""), file=sys.stderr)
    if args.json:
        write_json(result, args.json)
    return 0


def cmd_ngram(args, parser) -> int:
    from specmesh.proposers.ngram import build_corpus_cache, read_corpus
    from specmesh.model.loader import load_tokenizer
    from specmesh import catalog
    tokenizer = load_tokenizer(catalog.resolve(args.tokenizer))
    docs = read_corpus(Path(args.corpus), tokenizer, skip_heldout=args.skip_heldout)
    cache = build_corpus_cache(docs, cont_len=args.gram - 1)
    cache.tokenizer = tokenizer.fingerprint
    cache.save(args.out)
    print(f"{args.out}: {sum(len(p) for p, _ in cache.tables.values())} prefixes, "
          f"{Path(args.out).stat().st_size / 1e6:.1f} MB", file=sys.stderr)
    return 0


def cmd_train(args, parser) -> int:
    if args.specialise:
        from specmesh.training.drafters import specialise
        specialise(args.specialise, out=args.out or "models/drafters", work=args.work or "runs/drafters", init=args.init)
        return 0
    if args.teacher:
        from specmesh.training.distill import DistillConfig, run as distill
        distill(DistillConfig(teacher=args.teacher, out=args.out or "models/smollm2-draft",
                              work=args.work or "runs/distill", steps=args.steps, threads=args.threads or 0,
                              init=args.init or "", lr=args.lr))
        return 0
    from specmesh.training.train import TrainConfig, run
    run(TrainConfig(work=args.work or "runs/train", out=args.out or "models", tokens=args.tokens,
                    distill_tokens=args.distill_tokens, resume_from=args.resume_from or "", threads=args.threads or 0))
    return 0


COMMANDS = {"generate": cmd_generate, "tune": cmd_tune, "models": cmd_models, "bench": cmd_bench, "serve": cmd_serve,
            "loadtest": cmd_loadtest, "simulate": cmd_simulate, "ngram": cmd_ngram, "train": cmd_train}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    if unknown:                                  # named by the subcommand, as its other errors are
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")
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
    """The `specmesh` command: main(), then the process's end without the collector's last pass over every object
    (torch's among them) that Python's exit makes: those are freed with the process."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
