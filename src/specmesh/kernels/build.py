"""Building csrc/ for this machine and its ctypes signatures; which vector units this CPU has."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from specmesh.paths import cache_dir  # noqa: F401  (kernels.cache_dir: where the builds go)
from specmesh.settings import settings

CSRC = Path(__file__).parents[1] / "csrc"
SOURCE, AVX512_SOURCE, POOL_SOURCE = CSRC / "avx2.c", CSRC / "avx512.c", CSRC / "pool.c"
BLOCKS_SOURCE, BLOCKS512_SOURCE, BLOCKS_AMX_SOURCE = CSRC / "blocks.c", CSRC / "blocks512.c", CSRC / "blocks_amx.c"
GRIDS_SOURCE = CSRC / "grids.c"


class LayerWeights(ctypes.Structure):
    """csrc/avx2.c's Layer: a decoder layer's sizes and weight pointers."""
    _fields_ = [(n, ctypes.c_int) for n in ("D", "H", "Hkv", "hd", "I")] + [("kind", ctypes.c_int * 4)] + [
        ("glu", ctypes.c_int), ("eps", ctypes.c_float)] + [
        (n, ctypes.c_void_p) for n in ("attn_norm", "mlp_norm", "qkv", "o", "gate_up", "down",
                                       "qkv_s", "o_s", "gate_up_s", "down_s", "qkv_b", "o_b", "gate_up_b", "down_b",
                                       "reduce", "q_norm", "k_norm", "attn_post", "mlp_post")] + [
        ("act", ctypes.c_int), ("local", ctypes.c_int)]
    ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1}       # csrc/avx2.c's SILU, GELU_TANH


class ModelEnds(ctypes.Structure):
    """csrc/avx2.c's Ends: a model's embedding, rotary frequencies, final norm and head."""
    _fields_ = [(n, ctypes.c_int) for n in ("D", "V", "hd", "kind", "embed_kind")] + [("eps", ctypes.c_float)] + [
        (n, ctypes.c_void_p) for n in ("embed", "inv_freq", "norm", "head", "head_s", "head_b", "inv_freq_local")] + [
        ("embed_scale", ctypes.c_float)]


class Part(ctypes.Structure):
    """csrc/blocks.c's Part: rows of a GGUF file's matrix, of one block type, read where the file has them."""
    _fields_ = [("type", ctypes.c_int), ("rows", ctypes.c_int), ("stride", ctypes.c_int64), ("data", ctypes.c_void_p),
                ("map", ctypes.c_void_p), ("packed", ctypes.c_void_p)]


class Matrix(ctypes.Structure):
    """csrc/blocks.c's Matrix: up to MAX_PARTS parts, their rows one after another (a fused projection)."""
    MAX_PARTS = 3
    _fields_ = [("n", ctypes.c_int), ("part", Part * MAX_PARTS)]


@functools.cache
def kernel_version() -> str:
    """A digest of the C kernels' sources: it names their build, and `--method auto`'s measurements are kept per
    version (a change of the kernels measures again)."""
    return hashlib.sha256(b"".join(f.read_bytes() for f in sorted(CSRC.iterdir()))).hexdigest()[:16]


@functools.cache
def kernel_lib() -> ctypes.CDLL | None:
    """csrc/avx2.c (and csrc/avx512.c where gcc can build it) compiled for this machine (cached by
    source hash), or None where it cannot be. Where the CPU has AVX-512 its attention and int8
    products are switched on from the start (SPECMESH_KERNELS=no-avx512 keeps AVX2's, to compare), so a
    process computes every forward the same way.

    Its loops run on threads of its own (csrc/pool.c), as many as torch.set_num_threads says; it links
    PyTorch's own libgomp, whose team runs them where AMX does the products (amx_lib)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or shutil.which("gcc") is None:
        return None
    cache = settings().kernel_dir or cache_dir()
    lib = cache / f"avx2-{kernel_version()}.so"
    if not lib.exists():
        torch_lib = Path(torch.__file__).parent / "lib"
        omp = ["-fopenmp", f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lgomp"] \
            if (torch_lib / "libgomp.so.1").exists() else []
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            out = Path(tmp) / lib.name
            built = compiled(Path(tmp), omp[:1])
            base = [SOURCE, POOL_SOURCE, BLOCKS_SOURCE, GRIDS_SOURCE]
            wide = base + [AVX512_SOURCE, BLOCKS512_SOURCE]
            for files in (wide + [BLOCKS_AMX_SOURCE], wide, base):
                # without the AMX int8 tiles, then without AVX-512 too, where gcc is too old for them
                failed = [built[f] for f in files if built[f].returncode]
                build = failed[0] if failed else subprocess.run(
                    ["gcc", "-shared", *[str(Path(tmp) / f"{f.stem}.o") for f in files], "-o", str(out), *omp, "-lm",
                     "-lpthread"], capture_output=True, text=True)
                if build.returncode == 0:
                    break
            else:
                warnings.warn(f"could not build the AVX2 kernels, using PyTorch's: {build.stderr[-500:]}")
                return None
            out.replace(lib)                        # atomic: concurrent processes never see half a file
    kernel = ctypes.CDLL(str(lib))
    declare(kernel)
    if avx512_on(kernel):
        kernel.use_avx512(1)
        kernel.use_vnni(int(vnni_products(kernel)))
        kernel.use_tiles(int(tile_products(kernel)))
    return kernel


def compiled(folder: Path, flags: list[str]) -> dict[Path, subprocess.CompletedProcess]:
    """Each source of csrc/ compiled to folder/NAME.o, as many at once as there are cores (gcc takes one each), the
    longest first; source -> its gcc run."""
    sources = [AVX512_SOURCE, BLOCKS512_SOURCE, SOURCE, BLOCKS_SOURCE, BLOCKS_AMX_SOURCE, POOL_SOURCE, GRIDS_SOURCE]
    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        runs = {f: pool.submit(subprocess.run, ["gcc", "-O3", "-mavx2", "-mfma", "-mf16c", "-fPIC", *flags, "-c",
                                                str(f), "-o", str(folder / f"{f.stem}.o")], capture_output=True,
                               text=True) for f in sources}
    return {f: run.result() for f, run in runs.items()}


SCALARS = {"void": None, "int": ctypes.c_int, "float": ctypes.c_float, "double": ctypes.c_double,
           "int64_t": ctypes.c_int64, "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32}
PROTOTYPE = re.compile(r"^([a-z0-9_]+) +(\w+)\(([^)]*)\);", re.M)


def signatures() -> dict[str, tuple]:
    """csrc/api.h's functions: name -> (restype, argtypes)."""
    text = re.sub(r"//[^\n]*", "", (CSRC / "api.h").read_text())
    return {name: (SCALARS[ret], [] if args.strip() == "void" else [ctype(a) for a in args.split(",")])
            for ret, name, args in PROTOTYPE.findall(text)}


def ctype(declaration: str):
    """A parameter's ctypes type: `const Layer *L` -> POINTER(LayerWeights), `float *x` -> c_void_p, `int n`."""
    words = declaration.replace("*", " * ").split()[:-1]       # less the parameter's name
    kind = [w for w in words if w != "const"]
    if kind == ["Layer", "*"]:
        return ctypes.POINTER(LayerWeights)
    if kind == ["Matrix", "*"]:
        return ctypes.POINTER(Matrix)
    return ctypes.c_void_p if "*" in kind else SCALARS[kind[0]]


def declare(kernel: ctypes.CDLL) -> None:
    """Every function of csrc/api.h the library holds, with its signature (those of csrc/avx512.c are absent
    where it did not build)."""
    for name, (restype, argtypes) in signatures().items():
        if hasattr(kernel, name):
            function = getattr(kernel, name)
            function.restype, function.argtypes = restype, argtypes


AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
AMX = AVX512 | {"amx_tile", "amx_bf16", "avx512_bf16"}
DP = AVX512 | {"avx512_bf16"}
Q8 = AVX512 | {"avx512_vnni"}
AMX_INT8 = Q8 | {"amx_tile", "amx_int8"}


def avx512_on(lib: ctypes.CDLL) -> bool:
    """Whether `lib` runs its AVX-512 kernels (csrc/avx512.c built, the CPU has AVX-512, SPECMESH_KERNELS
    without no-avx512)."""
    return hasattr(lib, "amx_init") and AVX512 <= cpu_flags() and settings().kernel("avx512") is not False


def vnni_products(lib: ctypes.CDLL) -> bool:
    """Whether `lib`'s quantized products run on AVX512-VNNI (csrc/avx512.c built, the CPU has it, SPECMESH_KERNELS
    without no-avx512), else on AVX2's (the same values)."""
    return avx512_on(lib) and Q8 <= cpu_flags()


def tile_products(lib: ctypes.CDLL) -> bool:
    """Whether the packed K-quants' products of several rows run on AMX's int8 tiles (csrc/blocks_amx.c built, the CPU
    has them, Linux lends the tile registers, SPECMESH_KERNELS without no-amx), else on VNNI's (the same values)."""
    return vnni_products(lib) and AMX_INT8 <= cpu_flags() and settings().kernel("amx") is not False \
        and hasattr(lib, "packed_tiles") and lib.amx_init() == 0


@functools.cache
def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (Linux), else none."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                key, value = map(str.strip, line.split(":", 1))
                info.setdefault(key, value)
    except OSError:
        pass
    return info


def cpu_name() -> str:
    """The CPU's model name (Linux), else what the platform says."""
    return cpu_info().get("model name") or platform.processor() or platform.machine()


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers and the vector units the kernels use, e.g. "<name>
    (family F model M; avx2)": a VM's model name alone may not say which kind it is."""
    info = cpu_info()
    ids = f"family {info['cpu family']} model {info['model']}; " if {"cpu family", "model"} <= info.keys() else ""
    return f"{cpu_name()} ({ids}{vector_units() or 'no known vector units'})"


VECTOR_UNITS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "asimd", "sve")


def vector_units() -> str:
    """The kernels' vector units this CPU has, joined by "+" (part of `--method auto`'s cache key)."""
    return "+".join(u for u in VECTOR_UNITS if u in cpu_flags())


@functools.cache
def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux: "flags" on x86, "Features" on ARM), or none where they cannot be read."""
    info = cpu_info()
    return set(info.get("flags", info.get("Features", "")).split())


@functools.cache
def amx_lib() -> ctypes.CDLL | None:
    """The kernel library where this CPU has AMX with bf16 tiles (and AVX-512) and Linux lends the
    tile registers to this process, else None. SPECMESH_KERNELS=no-amx turns it off (to compare)."""
    lib = kernel_lib()
    if lib is None or not avx512_on(lib) or settings().kernel("amx") is False or not AMX <= cpu_flags():
        return None
    if lib.amx_init() != 0:
        return None
    lib.pool_use(0)                     # the tile kernels' OpenMP regions and the other loops on one team
    return lib


MEASURED: dict[str, bool] = {}      # what this process measured to choose its kernels (dp_lib)


@functools.cache
def dp_lib() -> ctypes.CDLL | None:
    """The kernel library where this CPU has AVX512-BF16's dot product but no AMX (where AMX is, its tiles
    are the faster product) and the dot product multiplies about as fast as 512-bit FMA, else None:
    an Intel core without AMX (or with AMX hidden by its hypervisor) runs FMA on the widened weights twice as
    fast (fma_lib; measured, dot_product_pays). SPECMESH_KERNELS=no-dp turns it off, =dp on (to
    compare)."""
    lib = kernel_lib()
    chosen = settings().kernel("dp")
    if lib is None or not avx512_on(lib) or amx_lib() is not None or chosen is False or not DP <= cpu_flags():
        return None
    if chosen is None:
        chosen = dot_product_pays(best_rate(lib, 1), best_rate(lib, 0))
        MEASURED["dp"] = chosen
    return lib if chosen else None


def inherited_kernels() -> dict[str, str]:
    """The environment a process this one starts gets, so that it chooses the kernels this one measured (every rank
    of a method multiplies alike, whatever its own measurement would say)."""
    switches = settings().kernels | {unit if on else f"no-{unit}" for unit, on in MEASURED.items()}
    return {"SPECMESH_KERNELS": ",".join(sorted(switches))} if switches else {}


def best_rate(lib: ctypes.CDLL, dot: int, tries: int = 5) -> float:
    """Multiply-adds a nanosecond of one core in csrc/avx512.c's register loop (mac_rate), the best of `tries`."""
    return max(lib.mac_rate(dot) for _ in range(tries))


def dot_product_pays(dot: float, fma: float) -> bool:
    """Whether bf16 products go on the dot product (vdpbf16ps, `dot` multiply-adds a ns) rather than on 512-bit
    FMA over the widened weights (`fma`): the FMA kernel also spends an instruction widening each weight vector,
    so it must multiply half as fast again to pay (the rates per CPU kind: docs/kernels.md)."""
    return fma < 1.5 * dot


@functools.cache
def fma_lib() -> ctypes.CDLL | None:
    """The kernel library where neither AMX nor a dot product that pays is (AVX2 CPUs, AVX-512 ones without
    AVX512-BF16, Intel cores without AMX): bf16 products on FMA over dp_pack's layout (FMALinear; 512-bit FMA
    where the CPU has AVX-512, the same values), else None. SPECMESH_KERNELS=no-fma keeps the
    older row-by-row kernel (BF16Linear), to compare."""
    lib = kernel_lib()
    if lib is None or amx_lib() is not None or dp_lib() is not None or settings().kernel("fma") is False:
        return None
    return lib


@functools.cache
def q8_lib() -> ctypes.CDLL | None:
    """The kernel library where it builds and the CPU has no AMX (whose tiles multiply the dequantized weights
    faster), else None: `--quant int8` / `int4` models and GGUF blocks run their Q8_0 / Q4_0 / Q4_1 products on
    it, on AVX512-VNNI's int8 dot product where the CPU has it, else on AVX2's (the same values).
    SPECMESH_KERNELS=no-q8 turns it off (to compare)."""
    lib = kernel_lib()
    if lib is None or amx_lib() is not None or settings().kernel("q8") is False:
        return None
    return lib


def native_bf16() -> bool:
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()
