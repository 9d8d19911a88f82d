"""Threads per process: rank 0 of a multi-process method takes its share of the cores unless the user chose."""
import os
import warnings

import pytest
import torch

from specmesh.timing import chosen_threads, rank_threads

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
