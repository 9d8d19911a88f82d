"""llama.cpp as a bench peer. Its weights (PEER_WEIGHTS, `specmesh bench --peer-weights`):
* "file" (the default): a GGUF target's own file as it is, whatever specmesh's dtype or --quant (what a llama.cpp
  user runs: SmolLM2's Q4_1 blocks, say); a folder (and a draft folder) as "same-precision";
* "same-precision": a GGUF file written from the checkpoint at specmesh's precision (`to_gguf`, cached in
  kernels.cache_dir()/gguf): bf16 for a bfloat16 run, f32 for float32, Q8_0 for `--quant int8` and Q4_0 for
  `--quant int4` (llama.cpp's own: an fp16 scale per 32 weights); in a bf16 run where specmesh runs a GGUF file's
  blocks as they are, that file itself.

llama.cpp          plain greedy decoding
llama.cpp-spec     speculative decoding with our draft (as GGUF)
llama.cpp-lookup   prompt lookup decoding

Two ways to run them, both built from llama-cpp-python's source package:
* llama.cpp's own tools (`NativeRunner`: llama-completion, llama-speculative with up to NATIVE_DRAFT tokens
  drafted, llama-lookup), where `python -m specmesh.bench.llamacpp build` put them (or SPECMESH_LLAMACPP_BIN
  points): the prompt as text with its special tokens (llama.cpp tokenizes it as specmesh does: the GGUF names
  the tokenizer's split rule, model/gguf.py), greedy, the run's thread count, the time the tool reports for the prompt and the decoding;
* else llama-cpp-python's bindings (`pip install -e ".[llamacpp]"`; `BindingRunner`): token ids in and out,
  speculation through its Python-level draft-model hook (DRAFT_TOKENS from our draft, or its
  LlamaPromptLookupDecoding): slower than the tools.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from specmesh.engine.stats import Stats
from specmesh.kernels import cache_dir
from specmesh.model.gguf import is_gguf
from specmesh.model.loader import read_config, runs_blocks, runs_file_blocks, to_gguf
from specmesh.options import PEER_WEIGHTS
from specmesh.paths import stamp
from specmesh.settings import settings

PEERS = ("llama.cpp", "llama.cpp-spec", "llama.cpp-lookup")
DRAFT_TOKENS = 4                # as specmesh's sd default γ
LOOKUP_TOKENS = 10              # llama-cpp-python's documented example value
PEER_CONTEXT = 4096             # llama.cpp's context (its KV cache): a prompt and its new tokens, not a 128k model's
NATIVE_DRAFT = 6                # llama-speculative's --spec-draft-n-max (the figure the issue measured with)
TOOLS = {"llama.cpp": "llama-completion", "llama.cpp-spec": "llama-speculative", "llama.cpp-lookup": "llama-lookup"}
BUILT = (*TOOLS.values(), "llama-quantize", "llama-bench")       # the peers' tools, and bench/shapes.py's


def cached_gguf(checkpoint: Path, ftype: str) -> Path:
    """The GGUF file of `checkpoint` in `ftype`, written on first use; for a bf16 run the GGUF file itself where
    specmesh runs its quantized blocks as they are (loader.runs_blocks, runs_file_blocks: llama.cpp then runs the same
    weights)."""
    if ftype == "bf16" and (runs_blocks(checkpoint, torch.bfloat16) or runs_file_blocks(checkpoint, torch.bfloat16)):
        return Path(checkpoint)
    checkpoint = Path(checkpoint).resolve()
    key = hashlib.sha256(stamp(checkpoint).encode()).hexdigest()[:16]
    root = cache_dir() / "gguf"
    out = root / f"{checkpoint.name}-{key}-{ftype}.gguf"
    if not out.exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        to_gguf(checkpoint, tmp, ftype)
        tmp.replace(out)
    return out


def peer_gguf(checkpoint: Path, ftype: str, weights: str = "file") -> Path:
    """The GGUF file a peer runs for `checkpoint` (PEER_WEIGHTS): a GGUF file itself under "file", else the copy
    in `ftype` (cached_gguf)."""
    if weights not in PEER_WEIGHTS:
        raise ValueError(f"peer weights {weights!r}: one of {', '.join(PEER_WEIGHTS)}")
    if weights == "file" and is_gguf(checkpoint):
        return Path(checkpoint)
    return cached_gguf(checkpoint, ftype)


def weights_label(path: Path, checkpoint: Path) -> str:
    """What a peer's file is, for the bench's report: the target's own file, or a same-precision copy."""
    if Path(path).resolve() == Path(checkpoint).resolve():
        return "file"
    return "same-precision"


def gguf_type(dtype: torch.dtype, quant: str | None) -> str:
    if quant is not None:
        return {"int8": "q8_0", "int4": "q4_0"}[quant]
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"the llama.cpp peers run bfloat16, float32 or --quant int8 / int4, not {dtype}")
    return "bf16" if dtype == torch.bfloat16 else "f32"


def _llama(path: Path, threads: int, context: int, **extra):
    try:
        from llama_cpp import Llama
    except ImportError:
        raise ValueError("the llama.cpp peers need llama.cpp's tools (python -m specmesh.bench.llamacpp build) "
                         "or llama-cpp-python (pip install -e .[llamacpp]): docs/usage.md") from None
    return Llama(model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads, n_batch=512,
                 verbose=False, **extra)


class DraftProposer:
    """llama-cpp-python's draft-model hook over a second llama.cpp model: DRAFT_TOKENS greedy tokens after
    the ids it is given, its cache kept for the prefix they share with the last call's."""

    def __init__(self, path: Path, threads: int, context: int):
        self.llm = _llama(path, threads, context)

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        out = []
        for token in self.llm.generate(input_ids.tolist(), top_k=1, temp=0.0, reset=True):
            out.append(token)
            if len(out) == DRAFT_TOKENS:
                break
        return np.array(out, dtype=np.intc)


def make_runner(kind: str, target: Path, draft: Path | None, dtype: torch.dtype, quant: str | None, threads: int,
                tokenizer, weights: str = "file"):
    """One of PEERS on `weights` (PEER_WEIGHTS): llama.cpp's own tool where it was built, else the bindings."""
    tool = native_bin() / TOOLS[kind]
    if tool.exists():
        return NativeRunner(kind, tool, target, draft, gguf_type(dtype, quant), threads, tokenizer, weights)
    return BindingRunner(kind, target, draft, dtype, quant, threads, weights)


def native_bin() -> Path:
    return settings().llamacpp_bin or cache_dir() / "llama.cpp" / "bin"


class NativeRunner:
    """One of PEERS through llama.cpp's own tool, a process per prompt."""
    impl = "native"

    def __init__(self, kind: str, tool: Path, target: Path, draft: Path | None, ftype: str, threads: int, tokenizer,
                 weights: str = "file"):
        self.tokenizer = tokenizer
        context = min(read_config(target).max_position_embeddings, PEER_CONTEXT)
        self.model = peer_gguf(target, ftype, weights)
        self.weights = weights_label(self.model, target)
        self.cmd = [str(tool), "-m", str(self.model), "--temp", "0", "-t", str(threads),
                    "-tb", str(threads), "-c", str(context), "--no-escape"]
        if kind == "llama.cpp":
            self.cmd += ["-no-cnv", "-sp"]  # the prompt as given (no chat template of its own); special tokens shown
        elif kind == "llama.cpp-spec":
            self.cmd += ["-md", str(peer_gguf(draft, ftype, weights)), "--spec-draft-n-max", str(NATIVE_DRAFT)]

    def __call__(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], Stats]:
        bos = self.tokenizer.bos_id
        if bos is not None and ids[:1] == [bos]:
            ids = ids[1:]                       # the tool adds the BOS the file's tokenizer adds (Gemma's) itself
        prompt = self.tokenizer.decode(ids, skip_special_tokens=False)      # the tools parse special tokens
        for attempt in range(3):            # the tools log from a thread of their own: now and then the
            run = subprocess.run(self.cmd + ["-p", prompt, "-n", str(max_new_tokens)], capture_output=True,
                                 text=True, errors="replace")  # timings are lost at exit; a random-weight
                                                               # model's bytes need not be UTF-8
            if run.returncode == 0 and not run.stdout and attempt < 2:
                continue                    # and now and then one exits at once, status 0, before the prompt
            if run.returncode != 0 or prompt not in run.stdout:
                raise RuntimeError(f"{self.cmd[0]} failed (exit {run.returncode}): {run.stderr[-300:]}")
            try:
                seconds = reported_seconds(run.stderr)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        text = run.stdout.split(prompt, 1)[1].split(" [end of text]")[0].removesuffix("\n\n")   # the tools end so
        tokens = self.tokenizer.inner.encode(text, add_special_tokens=False).ids[:max_new_tokens] if text else []
        return tokens, Stats(generated_tokens=reported_tokens(run.stderr) or len(tokens), elapsed_s=seconds)


def reported_seconds(log: str) -> float:
    """The prompt's and the decoding's time as the tool reports it (llama-speculative and llama-lookup:
    'encoded/decoded N tokens in S seconds'; llama-completion: 'prompt eval time' and 'eval time' in ms)."""
    spans = re.findall(r"(?:en|de)coded\s+\d+ tokens in\s+([\d.]+) seconds", log)
    if spans:
        return sum(map(float, spans))
    spans = re.findall(r"(?:prompt eval|\s eval) time =\s+([\d.]+) ms", log)
    if not spans:
        raise RuntimeError(f"no timings in llama.cpp's log: {log[-300:]}")
    return sum(map(float, spans)) / 1e3


def reported_tokens(log: str) -> int | None:
    """The new tokens the tool reports (llama-speculative and llama-lookup: 'decoded N tokens'; llama-completion:
    its eval 'runs', one a token after the first, which the prompt's eval gives), where it says: text re-encoded
    counts other tokens where it is not the tokens' own (bytes that are no UTF-8)."""
    decoded = re.findall(r"decoded\s+(\d+) tokens in", log)
    if decoded:
        return int(decoded[-1])
    runs = re.findall(r"\s eval time =\s+[\d.]+ ms /\s+(\d+) (?:runs|tokens)", log)
    return int(runs[-1]) + 1 if runs else None


class BindingRunner:
    """One of PEERS through llama-cpp-python's bindings, on the GGUF files of the target (and draft)."""
    impl = "python"

    def __init__(self, kind: str, target: Path, draft: Path | None, dtype: torch.dtype, quant: str | None,
                 threads: int, weights: str = "file"):
        ftype = gguf_type(dtype, quant)
        cfg = read_config(target)
        self.eos, context = set(cfg.eos_ids), min(cfg.max_position_embeddings, PEER_CONTEXT)
        extra = {}
        if kind == "llama.cpp-lookup":
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
            extra["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS)
        elif kind == "llama.cpp-spec":
            extra["draft_model"] = DraftProposer(peer_gguf(draft, ftype, weights), threads, context)
        if extra:
            extra["logits_all"] = True          # llama-cpp-python verifies drafts with every position's logits
        self.model = peer_gguf(target, ftype, weights)
        self.weights = weights_label(self.model, target)
        self.llm = _llama(self.model, threads, context, **extra)

    def __call__(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], Stats]:
        tokens = []
        self.llm.reset()
        start = time.perf_counter()
        for token in self.llm.generate(ids, top_k=1, temp=0.0, reset=True):
            if token in self.eos:
                break
            tokens.append(token)
            if len(tokens) == max_new_tokens:
                break
        return tokens, Stats(generated_tokens=len(tokens), elapsed_s=time.perf_counter() - start)


NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def without_amx() -> list[str]:
    """cmake flags leaving ggml's AMX backend out where this CPU has AMX: it crashes in its first product on these
    machines (ggml_backend_amx_mul_mat at ldtilecfg, ggml-org/llama.cpp#20824, unfixed upstream), as it does for
    ollama's users, whose CPU variants leave it out. The explicit -mno- flags win over -march=native's."""
    from specmesh.kernels.build import cpu_flags
    return [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"] if "amx_tile" in cpu_flags() else []


def build(source: Path | None = None) -> Path:
    """llama.cpp's tools (BUILT: the peers' and llama-quantize, llama-bench) from llama-cpp-python's source package
    (downloaded with pip if not given), compiled for this machine into native_bin(): about 10 minutes on 2 cores.
    Its HF-to-GGUF converter is kept beside them (converter())."""
    work = Path(tempfile.mkdtemp(prefix="specmesh-llamacpp-"))
    if source is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(work),
                        "llama-cpp-python"], check=True)
        source = next(work.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(source) as tar:
        tar.extractall(work, filter="data")
    tree = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
    subprocess.run(["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF",
                    *without_amx()], check=True)
    subprocess.run(["cmake", "--build", str(tree / "build"), "-j", str(os.cpu_count() or 2), "--target", *BUILT],
                   check=True)
    native_bin().mkdir(parents=True, exist_ok=True)
    for tool in BUILT:                              # static: each binary stands alone
        shutil.copy2(tree / "build" / "bin" / tool, native_bin() / tool)
    keep_converter(tree)
    shutil.rmtree(work)
    return native_bin()


CONVERTER = ("convert_hf_to_gguf.py", "conversion", "gguf-py")     # the script, its modules, its own gguf package


def keep_converter(tree: Path) -> None:
    """llama.cpp's convert_hf_to_gguf.py and what it imports, from a source tree into converter()'s folder."""
    dest = converter().parent
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in CONVERTER:
        if (tree / name).is_dir():
            shutil.copytree(tree / name, dest / name)
        elif (tree / name).exists():
            shutil.copy2(tree / name, dest / name)


def converter() -> Path:
    """Where `build` keeps llama.cpp's own convert_hf_to_gguf.py (run it with its folder's gguf-py: it puts that on
    sys.path itself)."""
    return native_bin().parent / "convert" / CONVERTER[0]


if __name__ == "__main__":
    if sys.argv[1:2] != ["build"]:
        sys.exit("usage: python -m specmesh.bench.llamacpp build [llama_cpp_python-X.tar.gz]")
    print(build(Path(sys.argv[2]) if len(sys.argv) > 2 else None))
