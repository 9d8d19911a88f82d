"""generate, tune, models: text from a prompt, auto's calibration, the models known by name."""
from __future__ import annotations

import sys

from specmesh.cli.args import (AUTO_DTYPE, DTYPE_CHOICES, add_json, add_method_options, add_model_args, add_prompt,
                               add_tune, checked_prompt, logit_bias, method_options, read_prompt, tuned, warn_unused,
                               write_json)
from specmesh.cli.ranks import serve_if_not_rank_0
from specmesh.options import CARDS, positive_int


def add(sub) -> None:
    g = sub.add_parser("generate", help="generate text from a prompt (streams to the terminal)")
    add_prompt(g, "the prompt text", "read the prompt verbatim from FILE ('-' for stdin)")
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
    add_prompt(t, "calibrate on this text (default: the shipped calibration prompts)",
               "calibrate on the text of FILE ('-' for stdin)")
    add_model_args(t)
    t.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="the dtype to tune for (each is cached apart); " + AUTO_DTYPE)
    add_json(t)

    m = sub.add_parser("models", help="list the models known by name (embedded, installed packages)")
    add_json(m)


def cmd_generate(args, parser) -> int:
    from specmesh import LLM, SamplingParams
    if (code := serve_if_not_rank_0(args)) is not None:
        return code
    if args.chat is None and args.system is not None:
        parser.error("--system goes with --chat")
    if args.chat is not None and (args.prompt is not None or args.prompt_file is not None):
        parser.error("give exactly one of PROMPT, --prompt-file or --chat")
    prompt = checked_prompt(args, read_prompt(args, parser) if args.chat is None else None)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, n=args.n, stop=args.stop, logprobs=args.logprobs,
                            frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
                            repetition_penalty=args.repetition_penalty, logit_bias=dict(args.logit_bias))
    from specmesh.methods import METHODS
    if (spec := METHODS.get(args.method)) is not None:
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
    prompts = [checked_prompt(args, read_prompt(args, parser))] if given else None     # before the models load
    llm = LLM(target=args.target, draft=args.draft, method="auto", device=args.device, dtype=args.dtype,
              quant=args.quant)
    choice = llm.tune(prompts, remeasure=True)
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
