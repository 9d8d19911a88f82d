"""csrc/pool.c: the kernels' loops on the pool's threads compute exactly what one thread computes, alone and
borrowing the cores of ranks that wait (on the threads the ranks' busy words leave free), and two processes that
share the cores each keep about their share of them."""
import ctypes
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from specmesh.kernels.build import kernel_lib
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model
from specmesh.timing import torch_threads


def kernel():
    lib = kernel_lib()
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
        assert lib.team_size() == 1                           # this process's threads
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
def test_the_pool_computes_what_one_thread_computes(tiny_checkpoint, quant):
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
        with torch_threads(2):
            assert all(torch.equal(a, b) for a, b in zip(expected, forwards()))
            kernel().pool_use(0)                                # OpenMP's team (where AMX does the products)
            try:
                assert all(torch.equal(a, b) for a, b in zip(expected, forwards()))
            finally:
                kernel().pool_use(1)
        for busy in ([1, 0], [1, 1]):                          # a thread borrowed, and none
            with lending(busy, cores=2):
                for _ in range(3):                             # workers asleep, then spinning
                    assert all(torch.equal(a, b) for a, b in zip(expected, forwards())), busy


DECODER = """
import os, sys, time
os.sched_setaffinity(0, CPUS)
import torch
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model
torch.set_num_threads(len(CPUS))
model = load_model(sys.argv[1], torch.bfloat16)
ids = torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))

def decode():
    cache = KVCache.for_model(model, 1, 256)
    model(ids, cache)
    cache.commit_all()
    for i in range(96):
        model(ids[:, i % 64:i % 64 + 1], cache)
        cache.commit_all()

with torch.inference_mode():
    decode()
    print("ready", flush=True)
    sys.stdin.readline()                    # all start together
    start = time.perf_counter()
    for _ in range(3):
        decode()
    print(time.perf_counter() - start, flush=True)
"""


def decoding_times(processes: int, cpus: set[int]) -> list[float]:
    """Seconds each of `processes` processes (one thread per cpu, all on `cpus`) takes to decode the same tokens
    with the embedded target, started together."""
    target = Path(__file__).resolve().parents[2] / "models" / "target"
    code = DECODER.replace("CPUS", repr(cpus))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(target)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    times = [float(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait(timeout=60)
    return times


@pytest.mark.cpu("-amx_tile")      # with AMX the loops run on OpenMP's team (csrc/pool.c): its threads spin
def test_two_processes_sharing_the_cores_each_keep_their_share():
    """Two processes of two threads on the same two cores: each about half as fast as alone (2x the time), not
    held up loop after loop by a thread of its own that is descheduled while its partner spins (OpenMP's team
    took 25-100x its time alone so, 2026-11-28)."""
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "this test needs two cores"
    cpus = set(cpus[:2])
    alone = decoding_times(1, cpus)[0]
    together = decoding_times(2, cpus)
    assert max(together) < 4 * alone, (alone, together)


UNLENDER = """
import ctypes, mmap, sys
import numpy as np
import torch
from specmesh.kernels.build import kernel_lib
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model
torch.set_num_threads(1)
lib, model = kernel_lib(), load_model(sys.argv[1], torch.bfloat16)
ids = torch.randint(0, model.config.vocab_size, (1, 8))
with torch.inference_mode():
    for _ in range(1500):
        memory = mmap.mmap(-1, 4096)                        # a rank's busy words, as runtime/link.py maps them
        words = np.frombuffer(memory, dtype=np.int32, count=2)
        words[:] = [1, 0]
        lib.pool_lend(ctypes.addressof(ctypes.c_char.from_buffer(memory)), 2, 2)
        model(ids, KVCache.for_model(model, 1, 16))        # a worker borrows the free core, then polls the words
        lib.pool_lend(None, 0, 0)
        del words
        memory.close()                                      # unmapped: no worker may read them any more
print("ok")
"""


def test_lending_ends_before_the_busy_words_are_unmapped():
    """pool_lend(NULL) returns once no worker reads the words: the link unmaps them next (a worker that polled
    them afterwards crashed the process, 2026-11-28)."""
    draft = Path(__file__).resolve().parents[2] / "models" / "draft"
    out = subprocess.run([sys.executable, "-c", UNLENDER, str(draft)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])
