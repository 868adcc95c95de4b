"""A decode step's indices read on the host once a step, for every layer that reads them
there (GLM5Next's latent attention, Qwen4Exp's QSA and PLE)."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.models.batch import DecodeIndex


def test_the_host_reads_a_steps_indices_once():
    d = DecodeIndex(
        np.array([3, 3, 5, 5], np.int32), np.array([7, 8, 2, 3], np.int32), None, tokens=2
    )
    assert d.host_slots == [3, 3, 5, 5] and d.host_positions == [7, 8, 2, 3]
    assert d.host_positions is d.host_positions and d.host_slots is d.host_slots
    assert d.host_slots[:: d.tokens] == d.lane_slots.tolist() == [3, 5]
