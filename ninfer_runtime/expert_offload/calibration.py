"""The residency priority from routing: how often each expert is chosen over a short text.

At load the model reads ``CALIBRATION_TEXT`` once (one prefill, no sampling), every MoE block
counting its routers' choices (``ExpertCounters``); the counts rank the experts for
``plan_residency``. The same weights give the same counts, so a load is reproducible. The
text mixes prose, dialogue, code and numbers so that no one domain's experts win alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .counters import ExpertCounters

CALIBRATION_TEXT = (
    "The committee met on Tuesday to review the budget. After a long discussion, members "
    "agreed to fund the new library and to repair the bridge before winter.\n"
    "User: How do I reverse a list in Python?\n"
    "Assistant: Use slicing, items[::-1], or call items.reverse() to change it in place.\n"
    "def mean(values):\n    return sum(values) / len(values)\n\n"
    "Der Zug fährt um 8:15 ab. Le musée ouvre à neuf heures. 東京は日本の首都です。\n"
    "Compute 17 * 23 = 391, then 391 + 9 = 400; the square root of 400 is 20.\n"
    "In 1969, astronauts landed on the Moon; the mission lasted eight days."
)


def routing_counts(
    runner: Any,
    counters: ExpertCounters,
    encode: Callable[[str], Sequence[int]],
    text: str = CALIBRATION_TEXT,
) -> dict[int, np.ndarray]:
    """Per layer, how many of ``text``'s tokens chose each expert (the model's blocks count
    into ``counters`` as they run; ``counters`` is left reset)."""
    ids = np.asarray(encode(text), dtype=np.int64)
    counters.reset()
    state = runner.new_state(len(ids) + 1)
    runner.prefill(ids, state, last_only=True)
    counts = counters.counts()
    counters.reset()
    return counts
