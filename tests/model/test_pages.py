"""Weights on huge pages (model/pages.py): the same values, ties kept, one mapping."""
import copy

import pytest
import torch

from specmesh import kernels
from specmesh.model import kernel_choice
from specmesh.model import pages
from specmesh.model.cache import KVCache


def mapping_of(t: torch.Tensor) -> dict[str, str]:
    """The /proc/self/smaps entry of the mapping holding t's first byte (its address range under "range")."""
    entry, inside = {}, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= t.data_ptr() < hi
            if inside:
                entry["range"] = head
        elif inside:
            key, _, value = line.partition(":")
            entry[key] = value.strip()
    return entry


def test_moved_weights_give_the_same_logits(tiny_model, monkeypatch):
    if kernels.kernel_lib() is None:
        pytest.fail("the C kernels did not build on this machine: csrc/avx2.c needs gcc and AVX2")
    model = tiny_model.bfloat16()
    apart = copy.deepcopy(model)
    kernel_choice.use_c_kernels(model)                      # moves its tensors onto huge pages
    monkeypatch.setattr(kernel_choice, "on_huge_pages", lambda m: 0)
    kernel_choice.use_c_kernels(apart)
    x = torch.randint(97, (2, 5))
    with torch.inference_mode():
        a = model(x, KVCache.for_model(model, 2, 32))
        b = apart(x, KVCache.for_model(apart, 2, 32))
    assert torch.equal(a, b)
    if pages.huge_pages():                               # one mapping (too small here for a huge page)
        assert mapping_of(model.lm_head.weight)["range"] == mapping_of(model.layers[0].block.mlp.down.weight)["range"]


def test_tied_tensors_stay_one():
    shared = torch.nn.Parameter(torch.randn(64, 32))
    module = torch.nn.Module()
    module.a = torch.nn.Linear(32, 64, bias=False)
    module.a.weight = shared
    module.b = torch.nn.Module()
    module.b.weight = shared
    module.b.plain = shared.detach()                     # a plain attribute on the same memory
    module.b.strided = torch.randn(8, 8).t()             # not contiguous: left where it is
    before = module.b.strided.data_ptr()
    moved = pages.on_huge_pages(module)
    if not pages.huge_pages():
        assert moved == 0
        return
    assert moved >= 64 * 32 * 4
    assert module.a.weight is module.b.weight
    assert module.b.plain.data_ptr() == module.a.weight.data_ptr()
    assert module.b.strided.data_ptr() == before
    assert torch.equal(module.a.weight, shared)


def test_a_safetensors_file_is_read_into_one_huge_mapping_or_each_tensor_its_own(tmp_path):
    """pages.load: safetensors' values; `huge=False` (a checkpoint folder's load): each tensor in memory of its own,
    none a view of the file's mapping (one view kept would keep the whole file resident)."""
    from safetensors.torch import load_file, save_file
    file = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(300, 70).bfloat16(), "b": torch.randn(5), "c": torch.arange(7)}, file)
    want = load_file(file)
    for huge in (True, False):
        got = pages.load(file, huge=huge)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        if not huge:
            assert all(t.untyped_storage().nbytes() == t.nbytes for t in got.values())
            files = [[int(x, 16) for x in line.split()[0].split("-")] for line in open("/proc/self/maps")
                     if line.rstrip().endswith(str(file))]
            assert files and not any(lo <= t.data_ptr() < hi for t in got.values() for lo, hi in files)
        elif pages.huge_pages():
            assert len({mapping_of(t)["range"] for t in got.values()}) == 1
