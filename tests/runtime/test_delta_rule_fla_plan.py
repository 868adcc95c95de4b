"""How the fla provider of the delta rule's ``prefill`` packs a prefill's segments into one
variable-length call (``fla.sequences``): pure bookkeeping, checked on the CPU; the call itself
is checked against the reference on the GPU (tests/gpu/test_delta_rule_providers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.ops.delta_rule.fla import sequences


def test_contiguous_segments_are_the_sequences_as_they_are() -> None:
    plan = sequences([(0, 5, 2), (5, 64, 0), (69, 1, 1)], 70)
    assert (plan.first, plan.end) == (0, 70)
    assert plan.bounds.tolist() == [0, 5, 69, 70] and plan.bounds.dtype == np.int64
    assert plan.gather.tolist() == [2, 0, 1]
    assert plan.kept.tolist() == [0, 1, 2]


def test_gaps_become_sequences_whose_states_are_dropped() -> None:
    """Segments given out of row order, rows of no segment before, between and after them
    (a later round's rows): the span starts at the first segment's row and ends with the
    last; a gap borrows the next segment's slot and is not among the kept sequences."""
    plan = sequences([(20, 4, 7), (3, 10, 5), (13, 0, 9)], 30)
    assert [s[:2] for s in plan.segments] == [(3, 10), (20, 4)]
    assert (plan.first, plan.end) == (3, 24)
    assert plan.bounds.tolist() == [0, 10, 17, 21]  # segment, gap of 7 rows, segment
    assert plan.gather.tolist() == [5, 7, 7]
    assert plan.kept.tolist() == [0, 2]


def test_no_rows_is_no_call_and_bad_segments_are_refused() -> None:
    assert sequences([(4, 0, 1)], 8) is None
    with pytest.raises(ValueError, match="overlap at row 4"):
        sequences([(0, 5, 0), (4, 2, 1)], 8)
    with pytest.raises(ValueError, match="past the 8 rows"):
        sequences([(6, 3, 0)], 8)
