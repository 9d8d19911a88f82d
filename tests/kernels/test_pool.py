"""csrc/pool.c: the kernels' loops on the pool's threads, borrowing the cores of ranks that wait, compute exactly
what OpenMP's team computes, on the threads the ranks' busy words leave free."""
import ctypes
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from specmesh.kernels.build import avx2_lib
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model
from specmesh.timing import torch_threads


def kernel():
    lib = avx2_lib()
    assert lib is not None, "the pool needs csrc/ built: an x86 CPU with AVX2 and gcc"
    lib.team_size.restype = ctypes.c_int
    return lib


@contextmanager
def lending(busy: list[int], cores: int):
    """This process's loops as a rank's among ranks whose busy words are `busy` (its own first)."""
    words = np.array(busy, dtype=np.int32)
    kernel().pool_lend(words.ctypes.data, len(words), cores)
    try:
        yield words
    finally:
        kernel().pool_lend(None, 0, 0)


def test_a_loop_runs_on_own_threads_plus_the_cores_no_busy_rank_holds():
    lib = kernel()
    with torch_threads(1):
        assert lib.team_size() == 1                           # OpenMP's team: this process's threads
        with lending([1, 0], cores=2):
            assert lib.team_size() == 2                       # the other rank waits: its core too
        with lending([1, 1], cores=2):
            assert lib.team_size() == 1
        with lending([1, 0, 0], cores=2):
            assert lib.team_size() == 2                       # never more than the cores
        with lending([1, 0, 1, 0], cores=4):
            assert lib.team_size() == 3
        with lending([1, 0], cores=2) as busy:
            busy[1] = 1                                       # a sender marks the waiting rank busy: the core goes back
            assert lib.team_size() == 1
    with torch_threads(2), lending([2, 0], cores=2):
        assert lib.team_size() == 2


@pytest.mark.parametrize("quant", [None, "int8", "int4"])
def test_the_pool_computes_what_openmp_computes(tiny_checkpoint, quant):
    model = load_model(tiny_checkpoint, torch.bfloat16, quant=quant)
    ids = torch.randint(0, model.config.vocab_size, (1, 80), generator=torch.Generator().manual_seed(0))

    def forwards():
        # a prefill (its norms and rotations in parallel too) and a 16-token forward over a cache
        outs = [model(ids, KVCache.for_model(model, 1, 128))]
        cache = KVCache.for_model(model, 1, 128)
        model(ids[:, :40], cache)
        cache.commit(0, range(40))
        return outs + [model(ids[:, 40:56], cache), model(ids[:, 56:57], cache)]

    with torch.inference_mode(), torch_threads(1):
        expected = forwards()
        for busy in ([1, 0], [1, 1]):                          # a thread borrowed, and none
            with lending(busy, cores=2):
                for _ in range(3):                             # workers asleep, then spinning
                    assert all(torch.equal(a, b) for a, b in zip(expected, forwards())), busy
