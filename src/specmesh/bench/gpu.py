"""The GPU check: one command for a lent GPU machine that runs, within a time budget, the `cuda` tests, the methods
on the embedded pair and SmolLM2 (float32 and bf16), and the costs at real shapes, and writes every result as a
file into the folder it is given (docs/gpu.md).

    python -m specmesh.bench.gpu OUT [--budget 480] [--device cuda] [--steps cuda-tests,shape-1b ...]
    python -m specmesh.bench.gpu --shape Llama-3.2-1B --json OUT/shape.json      # one shape's costs alone

Each step is a process of its own under what is left of the budget (its share at most): a step that fails or runs
out of time is recorded in OUT/summary.json (exit status, seconds, the tail of its output) and the next one runs.

A shape's costs (`shape_costs`): a random bf16 checkpoint in a published model's shape, made on the device by
transformers (nothing large travels) and saved to a temporary folder, loaded by specmesh; then, on the same
weights, the target's forward by rows (1 .. 16 after a 256-token prefix: decoding's and verification's widths),
`ar`'s decoding loop, both again on CUDA graphs (model/graph_forward.py; on the CPU its static forward, eagerly),
and transformers' own `generate` with its static cache and, on CUDA, `torch.compile`.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from specmesh.bench.shapes import SHAPES, Shape
from specmesh.model.graph_forward import GraphForward

ROWS = (1, 2, 4, 8, 16)                 # the forward's widths: decoding's row, verification's 2 .. 16
PREFIX, DECODED = 256, 64               # tokens in the cache before the timed forwards; tokens `ar` decodes
METHODS = "ar,sd,tree,selfdraft"
# what the steps import beyond torch: the core's libraries, the tests' and the transformers peer's
MODULES = ("safetensors", "tokenizers", "numpy", "tqdm", "gguf", "jinja2", "pytest", "scipy", "transformers")


def steps(out: Path, device: str) -> dict[str, tuple[list[str], float]]:
    """name -> (argv, the largest share of the budget it may take)."""
    bench = [sys.executable, "-m", "specmesh.cli", "bench", "--device", device, "--limit", "10"]
    return {
        "environment": ([sys.executable, "-m", "specmesh.bench.gpu", "--environment", "--device", device, "--json",
                         str(out / "environment.json")], 0.05),
        "cuda-tests": ([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "--junitxml",
                        str(out / "cuda-tests.xml"), "tests"], 0.25),
        "embedded-fp32": ([*bench, "--target", "embedded", "--dtype", "float32", "--methods", METHODS, "--json",
                           str(out / "embedded-fp32.json")], 0.15),
        "smollm2-fp32": ([*bench, "--dtype", "float32", "--methods", METHODS + ",pearl", "--json",
                          str(out / "smollm2-fp32.json")], 0.15),
        "smollm2-bf16": ([*bench, "--dtype", "bfloat16", "--methods", METHODS, "--json",
                          str(out / "smollm2-bf16.json")], 0.15),
        "smollm2-fp32-graphs": (["env", "SPECMESH_KERNELS=cuda-graphs", *bench, "--dtype", "float32", "--methods",
                                 METHODS, "--json", str(out / "smollm2-fp32-graphs.json")], 0.15),
        "shape-1b": ([sys.executable, "-m", "specmesh.bench.gpu", "--shape", "Llama-3.2-1B", "--device", device,
                      "--json", str(out / "shape-1b.json")], 0.15),
        "shape-8b": ([sys.executable, "-m", "specmesh.bench.gpu", "--shape", "Llama-3.1-8B", "--device", device,
                      "--json", str(out / "shape-8b.json")], 0.25),
    }


def run_steps(out: Path, budget: float, plan: dict[str, tuple[list[str], float]]) -> dict:
    """Each step in turn under min(its share, what is left) of `budget` seconds; OUT/summary.json after each."""
    out.mkdir(parents=True, exist_ok=True)
    start, summary = time.monotonic(), {"budget_s": budget, "steps": {}}
    for name, (argv, share) in plan.items():
        left = budget - (time.monotonic() - start)
        summary["steps"][name] = run_step(argv, min(left, share * budget)) if left > 5 else {
            "skipped": "the budget is spent"}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def run_step(argv: list[str], seconds: float) -> dict:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=seconds)
        rc, tail = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", b"".join(o or b"" for o in (e.stdout, e.stderr)).decode(errors="replace")
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "tail": tail[-3000:]}


# -- a shape's costs ------------------------------------------------------------------------------------
def hf_model(shape: Shape, device: str, dtype: torch.dtype):
    """transformers' Llama of `shape`, random (its own initializer), made on `device` in `dtype`."""
    import transformers
    if shape.arch != "llama":
        raise ValueError(f"{shape.name}: the GPU check makes Llama shapes only (not {shape.arch})")
    factor, low, high, original = shape.rope_llama3
    cfg = transformers.LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.hd, max_position_embeddings=shape.context, rms_norm_eps=shape.rms_eps,
        rope_theta=shape.rope_theta, tie_word_embeddings=shape.tied,
        rope_scaling={"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                      "original_max_position_embeddings": original})
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def timed(fn, device: str, repeat: int = 5) -> float:
    """fn's median wall time in ms over `repeat` calls after one warm-up, the device synchronized."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for i in range(repeat + 1):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        if i:
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def specmesh_costs(model, device: str, vocab: int) -> dict:
    """The forward by rows after PREFIX cached tokens (each timed forward rolled back), and `ar`'s loop."""
    from specmesh.model.cache import KVCache
    cache = KVCache.for_model(model, 1, PREFIX + DECODED + max(ROWS))
    ids = torch.randint(0, vocab, (1, PREFIX + max(ROWS)), device=device)
    model(ids[:, :PREFIX], cache)
    cache.commit_all()

    def forward(rows: int):
        model(ids[:, PREFIX:PREFIX + rows], cache)
        cache.rollback(0, PREFIX)
    by_rows = {rows: round(timed(lambda: forward(rows), device), 3) for rows in ROWS}

    def decode():
        token = ids[:, PREFIX:PREFIX + 1]
        for _ in range(DECODED):
            token = model(token, cache)[:, -1:].argmax(-1)
            cache.commit_all()
        cache.rollback(0, PREFIX)
    ms = timed(decode, device, repeat=2)
    return {"forward_ms_by_rows": by_rows, "ratio_16_to_1": round(by_rows[16] / by_rows[1], 3),
            "ar_tok_s": round(DECODED / ms * 1e3, 2)}


@torch.no_grad()
def transformers_tok_s(hf, device: str, vocab: int, compiled: bool) -> float:
    """transformers' greedy `generate` with its static cache (and torch.compile where `compiled`), DECODED tokens
    after a PREFIX-token prompt, prefill included, after one warm-up (compilation) run."""
    if compiled:
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
    prompt = torch.randint(0, vocab, (1, PREFIX), device=device)

    def generate():
        hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=DECODED, min_new_tokens=DECODED,
                    do_sample=False, cache_implementation="static", pad_token_id=0)
    return round(DECODED / timed(generate, device, repeat=2) * 1e3, 2)


def shape_costs(shape: Shape, device: str, dtype: torch.dtype = torch.bfloat16, compiled: bool | None = None) -> dict:
    from specmesh.model.loader import load_model
    hf = hf_model(shape, device, dtype)
    with tempfile.TemporaryDirectory(prefix="specmesh-shape-") as folder:
        t = time.perf_counter()
        hf.save_pretrained(folder)
        saved = time.perf_counter() - t
        model = load_model(folder, dtype, device)
    ours = specmesh_costs(model, device, shape.vocab)
    model.run_on(replace(model.execution, fast=GraphForward(model, capture=device.startswith("cuda"))))
    graphs = specmesh_costs(model, device, shape.vocab)
    del model
    compiled = device.startswith("cuda") if compiled is None else compiled
    theirs = transformers_tok_s(hf, device, shape.vocab, compiled)
    return {"shape": shape.name, "device": device, "dtype": str(dtype).removeprefix("torch."),
            "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
            "torch": torch.__version__, "save_s": round(saved, 1), **ours, "graphs": graphs,
            "graphs_ar_vs_eager": round(graphs["ar_tok_s"] / ours["ar_tok_s"], 3),
            "transformers_tok_s": theirs, "transformers_compiled": compiled,
            "ar_vs_transformers": round(ours["ar_tok_s"] / theirs, 3),
            "graphs_ar_vs_transformers": round(graphs["ar_tok_s"] / theirs, 3)}


def environment(device: str) -> dict:
    """The machine as the steps will find it: versions, the device, and which of MODULES cannot be imported."""
    import importlib
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    return {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(device) if cuda else device, "missing": missing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specmesh.bench.gpu", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, help="the folder the results go to")
    parser.add_argument("--budget", type=float, default=480, help="seconds for every step together (default 480)")
    parser.add_argument("--device", default="cuda", help="the device (default cuda)")
    parser.add_argument("--steps", help="a comma-separated subset of the steps, in their order (default: all)")
    parser.add_argument("--shape", choices=list(SHAPES), help="one shape's costs alone, as JSON (--json or stdout)")
    parser.add_argument("--environment", action="store_true", help="the machine's versions and missing modules alone")
    parser.add_argument("--json", type=Path, help="where --shape's or --environment's JSON goes")
    args = parser.parse_args(argv)
    if args.shape or args.environment:
        found = environment(args.device) if args.environment else shape_costs(SHAPES[args.shape], args.device)
        result = json.dumps(found, indent=1)
        args.json.write_text(result) if args.json else print(result)
        return 1 if args.environment and found["missing"] else 0
    if args.out is None:
        parser.error("give the folder the results go to (or --shape)")
    plan = steps(args.out, args.device)
    if args.steps:
        unknown = set(args.steps.split(",")) - plan.keys()
        if unknown:
            parser.error(f"unknown steps {', '.join(sorted(unknown))} (the steps: {', '.join(plan)})")
        plan = {name: plan[name] for name in plan if name in args.steps.split(",")}
    summary = run_steps(args.out, args.budget, plan)
    print(json.dumps({name: {k: v for k, v in step.items() if k != "tail"} for name, step in summary["steps"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
