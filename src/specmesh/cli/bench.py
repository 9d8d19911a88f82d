"""bench, loadtest, simulate: methods side by side, a running server under load, the pipelines and clusters on a
virtual clock."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from specmesh.cli.args import (DTYPE_CHOICES, add_json, add_method_options, add_model_args, add_prompt,
                               device_counts, json_took_prompt, method_options, plot_path, warn_unused, write_json)
from specmesh.options import CARDS, PEER_WEIGHTS, POLICIES, positive_int


def add(sub) -> None:
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
    b.add_argument("--link", type=link_rates, metavar="RATE[,RATE...]",
                   help="the multi-process methods (default: pp, pipedec, stpp, pearl, sd --tp 2, cosine's drafter "
                        "process) on one host and across two hosts made here at each link rate (network namespaces, "
                        "one core each; needs root), `specmesh simulate`'s figure beside each: the embedded pair in "
                        "bfloat16, each prompt's fastest of 5 answers (docs/hosts.md)")
    b.add_argument("--layer-similarity", action="store_true",
                   help="instead of timing methods: how fuzzy easyspec's layer groups of 2, 3 and 4 are for the draft "
                        "(mean cosine of a layer's exact input and attention output with the group's, on the prompts)")

    lt = sub.add_parser("loadtest", help="load a running server with streaming completions; latency percentiles")
    lt.add_argument("--url", required=True, help="the server root, without /v1 (e.g. http://127.0.0.1:8000)")
    mode = lt.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests per second")
    mode.add_argument("--concurrency", type=positive_int, help="closed loop: this many clients")
    lt.add_argument("--duration", type=float, required=True, metavar="SECONDS", help="how long to send requests")
    lt.add_argument("--prompts", metavar="FILE.jsonl", action="append",
                    help="prompt file, repeatable (a mixed load: one of chat turns, one of code; default: the shipped "
                         "held-out code)")
    lt.add_argument("--max-tokens", type=positive_int, default=64)
    lt.add_argument("--model", help="model id to send (default: none; the server's own)")
    lt.add_argument("--method", help="the method each request names (a server started with --methods; `auto`: the "
                                     "server chooses per request)")
    add_json(lt)

    sm = sub.add_parser("simulate", help="pipedec / pp / stpp on a virtual clock for N pipeline stages, pearl's draft "
                        "and target on devices of their own, easyspec / tree for a target split over N devices, "
                        "sd's target or cosine's drafters over hosts (--link), or cosine / sd / tree on a cluster "
                        "(simulated)")
    add_prompt(sm, "the prompt text (or --prompts FILE)")
    sm.add_argument("--prompts", metavar="FILE.jsonl", help="prompt file (one JSON object with 'prompt' per line)")
    sm.add_argument("--limit", type=positive_int, default=None, help="use the first K prompts of --prompts")
    sm.add_argument("--method", choices=["pipedec", "pp", "stpp", "pearl", "easyspec", "tree", "cosine", "sd"],
                    default="pipedec",
                    help="pipedec, pp, stpp: pipeline stages (--stages); easyspec, tree: a split target (--tp); "
                         "cosine, sd, tree with --concurrency: drafter nodes around a verification server")
    sm.add_argument("--concurrency", type=positive_int, metavar="N",
                    help="cosine / sd / tree: the prompts N at a time (a finished one's row goes to the next) on "
                         "CoSine's cluster, each method shown with sd's")
    sm.add_argument("--stages", type=positive_int, default=14, help="pipeline stages to simulate (default: 14)")
    sm.add_argument("--tp", type=device_counts, metavar="N[,N...]",
                    help="easyspec / tree: devices the target is split over (default: 2,4,8); easyspec is shown next "
                         "to exact drafting of the same tree. sd with --link: the ranks of `sd --tp N` (default: 2)")
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
    sm.add_argument("--gamma", type=positive_int, default=4,
                    help="pearl: drafts a round, fixed (default: 4; the real method's measured rule chooses by "
                         "wall-clock times); sd --link: its draft length (default: 4, sd's)")
    sm.add_argument("--draft-window", type=positive_int, default=64,
                    help="prompt tokens the draft reads (default: 64, as the methods')")
    sm.add_argument("--target", metavar="DIR")
    sm.add_argument("--draft", metavar="DIR")
    sm.add_argument("--drafters", metavar="DIR,DIR", help="cosine: its drafters (default: the target's shipped ones)")
    sm.add_argument("--calibrate", metavar="OUT.json", nargs="?", const="",
                    help="measure this machine's costs into a profile (default: the `local` profile, "
                         "models/profile-local.json of the checkout) and exit")
    sm.add_argument("--hosts", action="store_true",
                    help="with --calibrate: also measure a message's time between two hosts made here (network "
                         "namespaces; needs root), for --link")
    sm.add_argument("--link", type=link_rate, metavar="RATE",
                    help="pipedec / pp / stpp / pearl, sd's target split (--tp) and cosine's drafters: every rank on a "
                         "host of its own, joined by links of RATE (10gbit, 1gbit, 100mbit), with the profile's "
                         "latency between hosts (--calibrate --hosts)")
    sm.add_argument("--plot", metavar="OUT.png", type=plot_path,
                    help="simulate all three methods at 7, 14 and 21 stages and plot ms per token against depth")
    add_json(sm)


def link_rate(text: str) -> float:
    """"10gbit", "1gbit", "100mbit" (tc's units) -> Gbit/s."""
    units = {"gbit": 1.0, "mbit": 1e-3, "kbit": 1e-6}
    for unit, scale in units.items():
        if text.lower().endswith(unit):
            try:
                value = float(text[:-len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
    raise argparse.ArgumentTypeError(f"{text!r} is not a link rate like 10gbit, 1gbit or 100mbit")


def listed(text: str) -> list[str]:
    """A comma-separated option's items, stripped, empty ones left out."""
    return [item.strip() for item in text.split(",") if item.strip()]


def link_rates(text: str) -> list[str]:
    """--link's comma-separated rates, each checked by link_rate and kept as tc writes it."""
    rates = listed(text)
    for rate in rates or [text]:
        link_rate(rate)
    return rates


def cmd_bench(args, parser) -> int:
    from specmesh.bench.runner import BenchConfig, run_bench
    from specmesh.bench.report import print_table
    if args.link:
        return bench_across_hosts(args, parser)
    methods = listed(args.methods or ("ar" if args.quant else "ar,hf"))
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


def bench_across_hosts(args, parser) -> int:
    """bench --link: bench/crossing.py's runs, on the embedded pair (the simulator's profile is measured on it)."""
    from specmesh.bench import crossing
    from specmesh.bench.prompts import load_prompts
    from specmesh.bench.hosts import HostsError
    methods = listed(args.methods or ",".join(crossing.METHODS))
    if not methods:
        parser.error("--methods is empty")
    if not set(methods) <= set(crossing.METHODS):
        parser.error(f"--link runs {', '.join(crossing.METHODS)} across hosts, not "
                     f"{', '.join(m for m in methods if m not in crossing.METHODS)}")
    taken = [flag for flag, given in (("--target", args.target), ("--draft", args.draft), ("--quant", args.quant),
                                      ("--tp", args.tp > 1), ("--dtype", args.dtype not in ("auto", "bfloat16")),
                                      ("--device", args.device != "cpu"), ("--threads", args.threads),
                                      ("--peer-weights", args.peer_weights != "file")) if given]
    taken += [f"--{k.replace('_', '-')}" for k in method_options(args)]
    if taken:
        parser.error(f"--link runs the embedded pair in bfloat16 with the options `specmesh simulate` prices "
                     f"(docs/hosts.md); {', '.join(taken)} cannot go with it")
    prompts = load_prompts(args.prompts, args.limit, None) if args.prompts else crossing.PROMPTS[:args.limit]
    try:
        result = crossing.run(args.link, args.max_new_tokens, methods, prompts=prompts)
    except (HostsError, ValueError) as e:
        parser.error(str(e))
    print(crossing.table(result), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        write_json(result, args.json)
    if args.plot:
        crossing.plot(result, args.plot)
    return 0


def cmd_loadtest(args, parser) -> int:
    from specmesh.bench.prompts import load_prompts
    from specmesh.bench.loadtest import LoadConfig, print_summary, run
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    if args.duration <= 0:
        parser.error("--duration must be positive")
    cfg = LoadConfig(url=args.url, rate=args.rate, concurrency=args.concurrency, duration=args.duration,
                     prompts=[p for path in args.prompts or [None] for p in load_prompts(path, messages=True)],
                     max_tokens=args.max_tokens, model=args.model, method=args.method)
    summary, errors = run(cfg)
    print_summary(summary, sys.stderr if args.json == "-" else sys.stdout)
    for message in errors[:5]:
        print(f"error: {message}", file=sys.stderr)
    if args.json:
        write_json(summary, args.json)
    return 1 if summary["requests"] and summary["errors"] == summary["requests"] else 0     # none got through


def written(result: dict, args) -> int:
    """A simulation's end: its JSON where --json asks for it; exit status 0."""
    if args.json:
        write_json(result, args.json)
    return 0


def cmd_simulate(args, parser) -> int:
    from specmesh.bench.prompts import load_prompts
    from specmesh.simulator.calibration import calibrate
    from specmesh.simulator.pipelines import LOCAL, Profile, SimConfig, simulate
    if args.calibrate is not None:
        out = Path(args.calibrate) if args.calibrate else LOCAL
        profile = calibrate(out, hosts=args.hosts)
        print(f"{out}: a target layer {profile['stage']['layer_ms'][0]:.2f} ms per token, "
              f"hop {profile['hop_ms']:.3f} ms"
              + (f", between hosts {profile['link_ms']:.3f} ms" if args.hosts else ""), file=sys.stderr)
        return 0
    if (args.prompt is None) == (args.prompts is None):
        parser.error("give exactly one of PROMPT or --prompts FILE" + json_took_prompt(args))
    on_hosts = args.link is not None and not args.concurrency and args.method in ("sd", "cosine")
    cluster = not on_hosts and (args.method in ("cosine", "sd") or args.concurrency)
    split = args.method in ("easyspec", "tree")
    if args.link is not None and (cluster or split):
        parser.error(f"--link puts the ranks of pipedec, pp, stpp, pearl, sd --tp and cosine's drafters on hosts; "
                     f"{args.method}'s simulation has no hosts to put them on: drop --link")
    if on_hosts and args.method == "sd" and args.tp is not None and len(args.tp) != 1:
        parser.error("sd with --link simulates one split: give one --tp N")
    prompts = [args.prompt] if args.prompt is not None else load_prompts(args.prompts, args.limit)
    if on_hosts:
        from specmesh.simulator import drafter_hosts, split_hosts
        profile = dataclasses.replace(Profile.load(args.profile), link_gbit=args.link)
        profile.hop()                                       # a profile without link_ms: the error now
        if args.method == "sd":
            result = split_hosts.simulate(profile, (args.tp or [split_hosts.WORLD])[0], prompts, args.max_new_tokens,
                                          args.gamma, args.target, args.draft)
            where = f"its target over {result['tp']} hosts"
        else:
            result = drafter_hosts.simulate(profile, prompts, args.max_new_tokens, args.target,
                                            args.drafters or drafter_hosts.DRAFTERS)
            where = f"its drafters on hosts of their own, gamma {result['gamma']}"
        print(f"[simulated, profile {result['profile']}] {args.method}, {where}: {result['ms_per_token']:.2f} "
              f"ms/token, {result['tokens_per_s']:.1f} tokens/s, {result['tokens_per_round']:.3f} tokens/round",
              file=sys.stderr)
        return written(result, args)
    if cluster:
        from specmesh.simulator.cluster import ClusterProfile, print_cluster, simulate_cluster
        methods = [args.method] + [m for m in ("sd",) if m != args.method]
        result = simulate_cluster(methods, args.concurrency or 8, ClusterProfile.load(args.profile), prompts,
                                  args.max_new_tokens, args.target, args.draft, args.drafters)
        print_cluster(result, sys.stderr if args.json == "-" else sys.stdout)
        return written(result, args)
    if split:
        from specmesh.simulator.split_target import TPProfile, print_tp, simulate_tp
        result = simulate_tp(args.method, args.tp or [2, 4, 8], TPProfile.load(args.profile), prompts,
                             args.max_new_tokens, args.target, args.draft, args.calibration)
        print_tp(result, sys.stderr if args.json == "-" else sys.stdout)
        return written(result, args)
    pipedec, stpp = CARDS["pipedec"].defaults, CARDS["stpp"].defaults
    paper = args.profile == "gpu-cluster"
    profile = Profile.load(args.profile)
    if args.link is not None:
        profile = dataclasses.replace(profile, link_gbit=args.link)
        profile.hop()                                       # a profile without link_ms: the error now
    cfg = SimConfig(args.method, args.stages, profile, args.max_new_tokens,
                    args.tree_width or (32 if paper else pipedec["tree_width"]),
                    args.max_children or (16 if paper else pipedec["max_children"]),
                    args.depth or (5 if paper else stpp["gamma"]), args.draft_window, args.target, args.draft)
    if args.method == "pearl":
        from specmesh.simulator.parallel_draft import simulate as simulate_pearl
        result = simulate_pearl(cfg, prompts, args.gamma)
        print(f"[simulated, profile {result['profile']}] pearl, gamma {args.gamma}: {result['ms_per_token']:.2f} "
              f"ms/token, {result['tokens_per_s']:.1f} tokens/s, {result['tokens_per_timestep']:.3f} tokens/round",
              file=sys.stderr)
        return written(result, args)
    if args.plot:
        from specmesh.simulator.pipelines import sweep_plot
        table = sweep_plot(cfg, prompts, args.plot)
        for method, ms in table["ms_per_token"].items():
            print(f"[simulated] {method:8} " + "  ".join(f"{n} stages {v:7.2f} ms/token"
                                                         for n, v in zip(table["stages"], ms)), file=sys.stderr)
        return written(table, args)
    result = simulate(cfg, prompts)
    print(f"[simulated, profile {result['profile']}] {args.method} on {args.stages} stages: "
          f"{result['ms_per_token']:.2f} ms/token, {result['tokens_per_s']:.1f} tokens/s, "
          f"{result['tokens_per_timestep']:.3f} tokens/timestep"
          + (f", hit rate {result['hit_rate']:.3f}" if result["hit_rate"] is not None else ""), file=sys.stderr)
    return written(result, args)
