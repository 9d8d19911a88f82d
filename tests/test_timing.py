"""Threads per process: rank 0 of a multi-process method takes its share of the cores unless the user chose."""
import os
import time
import warnings

import pytest
import torch

from specmesh.timing import chosen_threads, rank_threads, widths_ms

CORES = len(os.sched_getaffinity(0))


def test_rank_zero_takes_its_share_of_the_cores():
    with rank_threads(2):
        assert torch.get_num_threads() == max(1, CORES // 2)
    with rank_threads(CORES + 3):
        assert torch.get_num_threads() == 1


def test_a_count_the_user_chose_is_kept_and_oversubscription_is_said():
    with chosen_threads(CORES), pytest.warns(UserWarning, match="oversubscribe"):
        with rank_threads(2):
            assert torch.get_num_threads() == CORES
    with chosen_threads(1), warnings.catch_warnings():
        warnings.simplefilter("error")
        with rank_threads(min(2, CORES)):                  # 1 + 1 threads on at least 2 cores: no warning
            assert torch.get_num_threads() == 1


class Launched(Exception):
    """What a method asked `connect` to launch (raised instead of launching)."""


@pytest.mark.parametrize("launcher", ["pipeline", "pearl", "cosine"])
def test_every_launched_process_gets_its_share_of_the_cores(launcher, monkeypatch):
    """On 8 cores a 2-process method gives each launched rank 4 threads, a 3-process one 2 (cosine: 2 drafters);
    the pipelines' ranks, which take turns, pearl's draft rank, which waits for most of a round, and cosine's
    drafter processes, which wait while the verifier verifies, lend their cores while they wait."""
    from types import SimpleNamespace

    from specmesh.proposers import remote_chain, remote_drafter
    from specmesh.runtime import pipeline

    def connect(roles, config, timeout, lend=False):
        raise Launched(len(roles), config["threads"], lend)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    target = SimpleNamespace(device=torch.device("cpu"), quant=None)
    with pytest.raises(Launched) as launched:
        if launcher == "pipeline":
            monkeypatch.setattr(pipeline, "connect", connect)
            pipeline.Pipeline.start(SimpleNamespace(target=target, target_path="t"), torch.float32,
                                    [range(0, 4), range(4, 8)], 5.0, "m:S")
        elif launcher == "pearl":
            monkeypatch.setattr(remote_chain, "connect", connect)
            remote_chain.DraftPeer.start(target, "d", torch.float32, 5.0)
        else:
            monkeypatch.setattr(remote_drafter, "connect", connect)
            remote_drafter.DrafterPool.start(["a", "b"], torch.float32, "cpu", None, 64)
    processes, threads, lend = launched.value.args
    assert threads == 8 // processes and lend


class Drifting:
    """A model whose forward sleeps 4 ms a row, three times as long once half its forwards are done: a machine
    whose speed changes while the widths are measured."""
    def __init__(self, model, forwards: int):
        self.model, self.calls, self.half = model, 0, forwards // 2

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, x, cache, *rest):
        self.calls += 1
        time.sleep(0.004 * x.shape[1] * (3 if self.calls > self.half else 1))
        return self.model(x, cache, *rest)


def test_the_widths_take_turns_so_a_drifting_machine_keeps_their_ratio(tiny_model):
    reps = 5
    model = Drifting(tiny_model, forwards=1 + 2 * (1 + reps))      # the prefill, then each width's warm-up and reps
    ms = widths_ms(model, (1, 8), context=8, reps=reps)
    assert 6 < ms[8] / ms[1] < 10.5, ms     # measured one width after the other: 17 here (24 in the sleeps alone)
