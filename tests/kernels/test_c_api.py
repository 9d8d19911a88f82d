"""csrc/api.h declares every C function Python calls, once: ctypes reads the signatures from it, and each C file
defining one includes it (the compiler checks the definitions against it)."""
import re
from pathlib import Path

from specmesh.kernels import build

SRC = Path(build.__file__).parents[1]


def test_the_header_gives_every_function_a_signature():
    signatures = build.signatures()
    assert {"model_forward", "attend", "gguf_linear", "shared_wait", "amx_init"} <= set(signatures)
    assert signatures["block_out"][1][0]._type_ is build.LayerWeights          # a Layer * is its structure
    assert signatures["mac_rate"][0] is build.ctypes.c_double and signatures["amx_init"][1] == []


def test_each_declared_function_is_defined_where_api_h_is_included():
    sources = {f: f.read_text() for f in (SRC / "csrc").glob("*.c")}
    for name in build.signatures():
        defining = [f for f, text in sources.items() if re.search(rf"^\w[\w ]*\*?\b{name}\([^;]*\{{", text, re.M)]
        assert defining, f"{name} is declared in csrc/api.h but defined in no csrc/*.c"
        assert all('#include "api.h"' in sources[f] for f in defining), (name, defining)


def test_no_signature_is_written_by_hand_in_python():
    for path in SRC.rglob("*.py"):
        assert ".argtypes =" not in path.read_text().replace("function.restype, function.argtypes =", ""), path
