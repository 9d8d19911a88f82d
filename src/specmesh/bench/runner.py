"""`specmesh bench`: methods side by side on the same prompts, in one run.

Every method decodes every prompt greedily; `ar` always runs (it is the reference
for speed and for output). Greedy outputs are compared token for token with `ar`'s
in the same dtype. In 16-bit, a first divergence where the reference's two best
logits are within NEAR_TIE_REL of each other (relative to the larger magnitude,
i.e. about 8 bfloat16 ulps) counts as a near-tie, not as a mismatch; float32 has no
near-tie allowance.
"""
from __future__ import annotations

import contextlib

import datetime
import gc
import os
import re
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from specmesh import catalog, methods
from specmesh.bench import llamacpp
from specmesh.bench.peers import PEERS as HF_PEERS, HFRunner
from specmesh.bench.prompts import load_prompts, prompt_file
from specmesh.bench.report import ratio
from specmesh.engine.stats import Stats
from specmesh.kernels import cpu_model
from specmesh.llm import default_dtype
from specmesh.lossless.sampling import SamplingParams
from specmesh.model.execution import Batch
from specmesh.model.kernel_choice import bf16_products
from specmesh.model.loader import DTYPES, load_tokenizer
from specmesh.model.pages import huge_pages
from specmesh.timing import CHOSEN, chosen_threads, copy_bandwidth_gb_s, share_of_cores, weight_bytes

PEERS = HF_PEERS + llamacpp.PEERS
NEAR_TIE_REL = 2 ** -5
CALIBRATION_TOKENS = 24


@dataclass
class BenchConfig:
    methods: list[str]
    prompts: str | None = None
    limit: int | None = None
    max_new_tokens: int = 128
    dtype: str = "auto"
    quant: str | None = None
    threads: int | None = None
    target: str | None = None
    draft: str | None = None
    device: str = "cpu"
    tp: int = 1                                     # specmesh's target split over tp processes (not the peers')
    peer_weights: str = "file"                      # the llama.cpp peers' weights (llamacpp.PEER_WEIGHTS)
    options: dict = field(default_factory=dict)     # method options given on the command line


class OurRunner:
    def __init__(self, method: str, cfg: BenchConfig, dtype: str):
        from specmesh.llm import LLM
        self.llm = LLM(target=cfg.target, draft=cfg.draft, method=method, device=cfg.device, dtype=dtype,
                       quant=cfg.quant, tp=cfg.tp, **cfg.options)
        if self.llm.auto:               # auto as it runs once calibrated (cached: the first bench measures)
            self.llm.tune()

    def __call__(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], Stats]:
        out = self.llm.generate(ids, SamplingParams(max_new_tokens=max_new_tokens))
        return out.tokens, out.stats

    def close(self) -> None:
        self.llm.close()


class Threaded:
    """A runner that runs with its own torch thread count (`sd@1t`)."""

    def __init__(self, runner, threads: int):
        self.runner, self.threads = runner, threads
        self.llm = getattr(runner, "llm", None)

    def __call__(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], Stats]:
        with chosen_threads(self.threads):
            return self.runner(ids, max_new_tokens)

    def close(self) -> None:
        close(self.runner)


def close(runner) -> None:
    if hasattr(runner, "close"):
        runner.close()


def split_threads(name: str) -> tuple[str, int | None]:
    """'sd@1t' -> ('sd', 1); 'sd' -> ('sd', None)."""
    match = re.fullmatch(r"(.+)@(\d+)t", name)
    return (match[1], int(match[2])) if match else (name, None)


def make_runner(name: str, cfg: BenchConfig, dtype: str):
    method, threads = split_threads(name)
    target = catalog.resolve(cfg.target)
    draft = catalog.resolve(cfg.draft, "draft") if cfg.draft else catalog.draft_for(target)
    if method in llamacpp.PEERS:           # its thread count is fixed when it loads
        used = threads or (CHOSEN[-1] if CHOSEN else torch.get_num_threads())
        return llamacpp.make_runner(method, target, draft, DTYPES[dtype], cfg.quant, used, load_tokenizer(target),
                                    cfg.peer_weights)
    if method in HF_PEERS:
        runner = HFRunner(method, target, draft if method == "hf-assisted" else None, DTYPES[dtype], cfg.device)
    else:
        runner = OurRunner(method, cfg, dtype)
    return runner if threads is None else Threaded(runner, threads)


def threads_used(name: str, options: dict) -> int | str:
    """The threads a method ran with: for the multi-process ones this process's (its share of the cores,
    timing.rank_threads, or NAME@Nt's N) plus each other process's share ("1+1": pipedec on two stages, two
    cores); else this process's (or NAME@Nt's N)."""
    method, chosen = split_threads(name)
    threads = chosen or (CHOSEN[-1] if CHOSEN else torch.get_num_threads())
    if method == "pearl":
        others = 1
    elif method in ("pp", "pipedec", "stpp"):
        others = options.get("stages", 2) - 1 + (method != "pp" and bool(options.get("draft_apart")))
    else:
        return threads
    if not chosen and not CHOSEN:
        threads = share_of_cores(others + 1)
    return "+".join([str(threads)] + [str(share_of_cores(others + 1))] * others)


def choose_dtype(method: str, cfg: BenchConfig, ids: list[int]) -> tuple[str, object]:
    """The configured dtype; for 'auto', specmesh's methods in the dtype `generate` takes (llm.default_dtype), a
    peer in the faster of float32/bfloat16 on a short calibration run, or in `ar`'s where it runs the target's own
    file whatever the dtype (its outputs are then compared with `ar`'s own: no reference in another dtype, which
    for an 8B in float32 would not fit in memory)."""
    if cfg.dtype != "auto" or split_threads(method)[0] not in PEERS:
        dtype = default_dtype(cfg.device) if cfg.dtype == "auto" else cfg.dtype
        return dtype, make_runner(method, cfg, dtype)
    runner = make_runner(method, cfg, default_dtype(cfg.device))
    if getattr(runner, "weights", None) == "file":
        return default_dtype(cfg.device), runner
    close(runner)
    best = None
    for dtype in ("float32", "bfloat16"):
        runner = make_runner(method, cfg, dtype)
        runner(ids, 4)                                           # warm-up
        start = time.perf_counter()
        runner(ids, CALIBRATION_TOKENS)
        elapsed = time.perf_counter() - start
        if best is None or elapsed < best[0]:
            if best is not None:
                close(best[2])
            best = (elapsed, dtype, runner)
        elif runner is not best[2]:
            close(runner)
    return best[1], best[2]


def check_methods(names: list[str], quant: str | None = None) -> list[str]:
    """ar first; `pearl` brings `sd@1t` and `sd@2t` (its two processes have one thread each)."""
    for name in names:
        method, threads = split_threads(name)
        if method not in methods.METHODS and method not in PEERS and method != "auto":
            raise ValueError(f"unknown method {name!r}; available: auto, {', '.join([*methods.METHODS, *PEERS])} "
                             f"(NAME@Nt runs NAME with N threads)")
        if threads == 0:
            raise ValueError(f"{name}: NAME@Nt needs N >= 1 threads")
        if threads and threads > (cores := len(os.sched_getaffinity(0))):
            warnings.warn(f"{name}: {threads} threads oversubscribe this process's {cores} cores: its threads will "
                          f"wait for each other's cores")
    if "pearl" in names:
        names = names + ["sd@1t", "sd@2t"]
    if quant and any(split_threads(n)[0] in HF_PEERS for n in names):
        raise ValueError(f"--quant {quant} quantizes specmesh's models; the hf peers would run other weights: "
                         f"bench them without --quant (the llama.cpp peers run a GGUF file: the target's own, or a "
                         f"Q8_0 / Q4_0 copy)")
    return ["ar"] + [m for m in dict.fromkeys(names) if m != "ar"]


def reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _status_mb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def peak_rss_mb() -> float | None:
    return _status_mb("VmHWM")


def current_rss_mb() -> float | None:
    return _status_mb("VmRSS")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def is_near_tie(model, prefix: list[int]) -> bool:
    """Are the reference model's two best next-token logits after `prefix` within rounding?"""
    with torch.inference_mode():
        logits = model(torch.tensor([prefix], device=model.device), batch=Batch(last_only=True))[0, -1]
    top = logits.topk(2).values
    return bool(top[0] - top[1] <= NEAR_TIE_REL * top.abs().max().clamp(min=1.0))


def summarize(dtype: str, threads: int | str, runs: list[tuple[list[int], Stats]], refs: list[list[int]],
              near_ties: int, rss: float | None) -> dict:
    stats = [s for _, s in runs]
    tokens = sum(s.generated_tokens for s in stats)
    drafted = sum(s.drafted_tokens for s in stats)
    verifications = sum(s.verifications for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    phases = sum(s.phases for s in stats)
    timesteps, decisions = sum(s.timesteps for s in stats), sum(s.decisions for s in stats)
    timed = verifications and any(s.verify_s for s in stats)    # the shared speculative step times its two parts
    return {
        "dtype": dtype, "threads": threads,
        "tokens_per_s": tokens / sum(s.elapsed_s for s in stats),
        "speedup_vs_ar": None,
        "tokens_per_forward": tokens / forwards if (forwards := sum(s.target_forwards for s in stats)) else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": accepted / verifications if verifications else None,
        "draft_ms_per_step": 1e3 * sum(s.draft_s for s in stats) / verifications if timed else None,
        "verify_ms_per_step": 1e3 * sum(s.verify_s for s in stats) / verifications if timed else None,
        "verifications": verifications,
        "rows_per_verification": (drafted + verifications) / verifications if verifications else None,
        "draft_forwards_per_step": sum(s.draft_forwards for s in stats) / verifications if verifications else None,
        "greedy_equal_to_ar": sum(t == r for (t, _), r in zip(runs, refs)),
        "near_tie_divergences": near_ties,
        "prompts": len(runs), "peak_rss_mb": rss,
    } | ({"mat": accepted / phases} if phases else {}) | stats[0].info \
        | ({"tokens_per_timestep": tokens / timesteps} if timesteps else {}) \
        | ({"hit_rate": sum(s.hits for s in stats) / decisions} if decisions else {})


def memory_bound(target: torch.nn.Module) -> dict:
    """What memory bandwidth allows `ar`: the target's weight bytes per token against a copy bandwidth measured
    on the target's device."""
    gb_s, mb = copy_bandwidth_gb_s(device=target.device), weight_bytes(target) / 1e6
    return {"copy_gb_s": round(gb_s, 2), "target_weight_mb": round(mb, 1),
            "ar_tokens_per_s_bound": round(gb_s * 1e3 / mb, 1)}


def commit() -> str | None:
    """The checkout's commit (short), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def described(cfg: BenchConfig, prompts: Path) -> dict:
    """What a bench ran, as its JSON records it: the models and prompts by name, the new tokens, the dtype."""
    name = lambda path: Path(path).name if path else None           # noqa: E731
    return {"target": name(cfg.target) or catalog.default(), "draft": name(cfg.draft), "prompts": prompts.stem,
            "prompt_count": cfg.limit, "max_new_tokens": cfg.max_new_tokens, "dtype": cfg.dtype}


def machine(device: str = "cpu") -> str:
    gpu = f", {torch.cuda.get_device_name(device)}" if torch.device(device).type == "cuda" else ""
    pages = "" if gpu else ", weights on 2 MiB pages" if huge_pages() else ", weights on 4 KiB pages"   # model/pages.py
    products = "" if gpu else f", bf16 products on {bf16_products()}"
    held = "".join(f", {k}={os.environ[k]}" for k in ("SPECMESH_KERNELS", "ATEN_CPU_CAPABILITY") if os.environ.get(k))
    return f"{cpu_model()}, {os.cpu_count()} cores{gpu}{pages}{products}{held}, torch {torch.__version__}"


def run_bench(cfg: BenchConfig) -> dict:
    with chosen_threads(cfg.threads) if cfg.threads else contextlib.nullcontext():
        return bench(cfg)


def bench(cfg: BenchConfig) -> dict:
    names = check_methods(cfg.methods, cfg.quant)
    measured = commit()                                     # the code that runs, before the runs take minutes
    tokenizer = load_tokenizer(catalog.resolve(cfg.target))
    prompts = load_prompts(cfg.prompts, cfg.limit, tokenizer)
    ids = [tokenizer.encode(p) for p in prompts]
    runners, dtypes, rss, load_s = {}, {}, {}, {}
    base = current_rss_mb()
    for name in tqdm(names, desc="load", unit="method"):      # load and calibrate one method at a time
        gc.collect()
        reset_peak_rss()
        before, start = current_rss_mb(), time.perf_counter()
        dtypes[name], runners[name] = choose_dtype(name, cfg, ids[0])
        load_s[name] = time.perf_counter() - start             # models, kernels, a dtype or auto's calibration
        rss[name] = None if base is None else base + peak_rss_mb() - before
    # timed runs interleave the methods prompt by prompt (rotating the order), so that a
    # machine whose speed drifts over minutes affects every method alike
    runs = {name: [] for name in names}
    bar = tqdm(total=len(names) * len(ids), desc="bench", unit="run")
    for i, prompt_ids in enumerate(ids):
        for name in names[i % len(names):] + names[:i % len(names)]:
            bar.set_postfix(method=name)
            runs[name].append(runners[name](prompt_ids, cfg.max_new_tokens))
            bar.update()
    bar.close()
    references = {dtypes["ar"]: (runners["ar"], [t for t, _ in runs["ar"]])}   # dtype -> (ar runner, outputs)
    result = {"machine": machine(cfg.device), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": measured, "config": described(cfg, prompt_file(cfg.prompts, tokenizer)), "methods": {},
              "per_prompt": []}
    for name in names:
        dtype = dtypes[name]
        if dtype not in references:                    # ar's output in this method's dtype, untimed
            ref_runner = make_runner("ar", cfg, dtype)
            references[dtype] = (ref_runner, [ref_runner(p, cfg.max_new_tokens)[0] for p in ids])
        ref_runner, refs = references[dtype]
        near = 0
        for i, ((tokens, stats), ref) in enumerate(zip(runs[name], refs)):
            div = first_divergence(tokens, ref)
            tie = div is not None and DTYPES[dtype] != torch.float32 and div < len(ref) and \
                is_near_tie(ref_runner.llm.models.target, ids[i] + ref[:div])
            near += tie
            result["per_prompt"].append({
                "method": name, "prompt": i, "new_tokens": stats.generated_tokens, "elapsed_s": stats.elapsed_s,
                "tokens_per_s": stats.tokens_per_s,
                "target_forwards": stats.target_forwards, "equal_to_ar": div is None,
                "first_divergence": div, "near_tie": tie})
        result["methods"][name] = summarize(dtype, threads_used(name, cfg.options), runs[name], refs, near, rss[name])
        result["methods"][name]["load_s"] = round(load_s[name], 2)
        if hasattr(runners[name], "impl"):                 # a llama.cpp peer: its tool or the bindings, its file
            result["methods"][name] |= {"impl": runners[name].impl, "peer_weights": runners[name].weights,
                                        "peer_model": runners[name].model.name}
        llm = getattr(runners[name], "llm", None)
        if llm is not None and split_threads(name)[0] not in PEERS:
            used = llm.method_for(ids)              # auto: what it chose for these prompts
            result["methods"][name]["options"] = used.options
            if llm.choice is not None:
                result["methods"][name]["chose"] = used.name
    if cfg.quant is None and hasattr(runners["ar"], "llm"):
        result["memory_bound"] = memory_bound(runners["ar"].llm.models.target)
    for runner in runners.values():
        close(runner)
    ar_speed = result["methods"]["ar"]["tokens_per_s"]
    for name, m in result["methods"].items():
        m["speedup_vs_ar"] = m["tokens_per_s"] / ar_speed
        m["speedup_ci95"] = ratio(result, name, "ar")[1]
    return result
