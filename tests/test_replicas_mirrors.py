"""Copies of a replicated value: a departure one dumped step shows by itself (precnb.analysis.replicas.mirrors)."""

from __future__ import annotations

import numpy as np

from precnb.analysis.replicas.mirrors import copies_of_replicated

REDUCED = [1.0, -1.0, 0.1, 2.0]


def test_a_copy_changed_after_the_collective_is_found_and_its_rank_named():
    stats = np.array([[REDUCED, REDUCED], [REDUCED, [1.1, -1.1, 0.11, 2.2]]])  # (rank, tensor, stat)
    got = copies_of_replicated(stats, np.ones((2, 2), np.int64), np.ones(2, bool))
    assert got.tolist() == [[False, True], [False, False]]  # rank 0 holds the reduced value, rank 1 does not


def test_a_ranks_part_of_a_max_reduction_is_not_a_copy():
    # rank 1 holds every token's maximum: its local max equals the all-reduced one, rank 0's does not
    local0, local1 = [0.9, -1.0, 0.05, 1.8], REDUCED
    stats = np.array([[REDUCED, local0, local0], [REDUCED, local1, local1]])  # reduced, local max, the all-reduce input
    numel = np.ones((2, 3), np.int64)
    parts = np.array([False, False, True])
    assert copies_of_replicated(stats, numel, np.ones(3, bool)).any()  # without knowing the reduction's inputs
    assert not copies_of_replicated(stats, numel, np.ones(3, bool), parts).any()


def test_constant_whole_number_and_differently_sized_values_say_nothing():
    ones = [1.0, 1.0, 1.0, 4.0]
    counts = [3.0, 0.0, 1.0, 5.0]
    stats = np.array([[ones, counts, REDUCED], [ones, counts, [1.2, -1.0, 0.1, 2.0]]])
    numel = np.array([[16, 4, 8], [16, 4, 8]])
    assert not copies_of_replicated(stats, numel, np.ones(3, bool)).any()  # nothing usable is replicated
    stats2 = np.array([[REDUCED, REDUCED], [REDUCED, [1.2, -1.0, 0.1, 2.0]]])
    assert not copies_of_replicated(stats2, np.array([[8, 16], [8, 16]]), np.ones(2, bool)).any()
