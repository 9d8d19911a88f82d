"""What every command's parser shares: one-line errors with the defaults in the help, the value types, the
model, method-option and --json flags, and reading a prompt."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from specmesh.options import natural, non_negative, positive_int, probability
from specmesh.settings import DTYPES

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


DTYPE_CHOICES = ["auto", *DTYPES]
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


def add_prompt(p: argparse.ArgumentParser, what: str, file_help: str | None = None) -> None:
    """PROMPT, the same by name (-p/--prompt: else argparse would read --prompt as --prompt-file or --prompts) and,
    with `file_help`, --prompt-file."""
    p.add_argument("prompt", nargs="?", help=what)
    p.add_argument("-p", "--prompt", dest="named_prompt", metavar="TEXT", help="the same, by name")
    if file_help:
        p.add_argument("--prompt-file", metavar="FILE", help=file_help)


def take_named_prompt(args, parser) -> None:
    """--prompt TEXT as PROMPT; both given: a usage error."""
    if getattr(args, "named_prompt", None) is not None:
        if args.prompt is not None:
            parser.error("give the prompt once: PROMPT or --prompt")
        args.prompt = args.named_prompt


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
                       help="split the target over N processes (tensor parallelism) for ar, sd, tree, easyspec, "
                            "cosine, selfdraft and suffix; launched here, or one rank per torchrun process "
                            "(docs/tensor-parallel.md)")


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


def option_help(having: list) -> str:
    """An option's help with the methods that have it and their defaults, from the declarations."""
    from specmesh.options import described
    helps = described(having)
    if len(helps) == 1:
        return f"{helps[0][0]} ({helps[0][1]})"
    return "; ".join(f"{shown}: {help}" for help, shown in helps)


def option_flag(having: list) -> dict:
    """argparse's keywords for one option of the methods `having` it ((card, field) pairs): the loosest of
    their bounds (each method checks its own when it is configured)."""
    m = [f.metadata for _, f in having]
    kind = type(having[0][1].default)
    if kind is bool:
        return dict(action="store_const", const=True, default=None)
    parse = {int: positive_int if min(x["least"] for x in m) else natural,
             float: probability if max(x["most"] for x in m) == 1 else non_negative}.get(kind, str)
    choices = sorted({c for x in m for c in x["choices"]}) if all(x["choices"] for x in m) else None
    return dict(type=parse, metavar=m[0]["metavar"] or "N", choices=choices)


def add_method_options(p: argparse.ArgumentParser, methods: list[str] | None = None) -> None:
    """Method options, generated from specmesh/options.py's dataclasses: each applies to the methods that have
    it, with their defaults (`methods`: only these methods' options)."""
    from specmesh.options import declared
    o = p.add_argument_group("method options (default: each method's tuned value, or the draft's own "
                             "where its folder has an options.json: docs/methods.md)")
    for name, having in declared(methods).items():
        o.add_argument("--" + name.replace("_", "-"), help=option_help(having), **option_flag(having))


def method_options(args) -> dict:
    from specmesh.options import declared
    return {k: getattr(args, k) for k in declared() if getattr(args, k, None) is not None}


def warn_unused(args, names: list[str]) -> None:
    """A warning for each option given that none of the methods `names` uses (auto and the bench's peers: any may)."""
    from specmesh.options import CARDS
    specs = [CARDS.get(name.split("@")[0]) for name in names]
    if None in specs:
        return
    unused = [k for k in method_options(args) if not any(k in spec.fields for spec in specs)]
    if args.draft is not None and not any(spec.needs_draft for spec in specs):
        unused.append("draft")
    for k in unused:
        warnings.warn(f"--{k.replace('_', '-')} does not apply to {', '.join(names)}: ignored")


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


def checked_prompt(args, text: str | None) -> str:
    """The prompt: `text`, or --chat (and --system) rendered through the target's chat template; its errors
    (empty, past the target's context, a chat for a model without a template) come before the models load
    and `auto` measures (up to a minute the first time): this needs the tokenizer and config alone."""
    from specmesh import catalog
    from specmesh.engine.engine import check_prompt
    from specmesh.model.loader import load_tokenizer, read_config
    path = catalog.resolve(args.target)
    tokenizer = load_tokenizer(path)
    if getattr(args, "chat", None) is not None:
        system = [{"role": "system", "content": args.system}] if args.system is not None else []
        text = tokenizer.render_chat(system + [{"role": "user", "content": args.chat}])
    config = read_config(path)                              # a folder's or a GGUF file's
    check_prompt(tokenizer.encode(text) if text else [], config.max_position_embeddings, config.vocab_size)
    return text
