"""``SnapshotLayout``: where a sequence's slot states go in a snapshot's pages, and its copy of
every run in one call (``copy_ranges``), on host arrays (the GPU file runs it on the device);
and a round's marks saved in one call (``batch.save_marks``)."""

from __future__ import annotations

import gc
import itertools
import weakref

import numpy as np
import pytest

from ninfer_runtime.models.batch import Mark, save_marks
from ninfer_runtime.snapshots import SnapshotLayout, copy_ranges


def arrays(xp=np):
    """Two page parts of 48 and 80 bytes a row, three state parts of 100, 8 and 200 bytes a
    row: runs cross parts and pages, and no size is a multiple of 16."""
    rng = np.random.default_rng(0)
    pages = [xp.zeros((6, 12), xp.float32), xp.zeros((6, 20), xp.float32)]
    states = [
        xp.asarray(rng.standard_normal((3, 25)).astype(np.float32)),
        xp.asarray(rng.integers(0, 9, (3, 2)).astype(np.int32)),
        xp.asarray(rng.standard_normal((3, 50)).astype(np.float32)),
    ]
    return pages, states


def test_the_runs_cover_every_state_byte_once_and_stay_inside_their_rows() -> None:
    pages, states = arrays()
    layout = SnapshotLayout(pages, states)
    t = layout.table
    assert layout.pages == 3  # 308 bytes of states, 128 a page
    for s, state in enumerate(states):
        runs = t[t[:, 0] == s]
        assert runs[:, 5].sum() == state[0].nbytes
        assert list(runs[:, 1]) == list(np.cumsum([0, *runs[:-1, 5]]))  # end to end
    row = np.array([p[0].nbytes for p in pages])
    assert (t[:, 4] + t[:, 5] <= row[t[:, 3]]).all()
    # no two runs share a byte of the snapshot
    spans = sorted((page, part, at, at + n) for _, _, page, part, at, n in t.tolist())
    for a, b in itertools.pairwise(spans):
        assert a[:2] != b[:2] or a[3] <= b[2]


def test_a_copy_keeps_and_restores_the_states_it_names_only() -> None:
    pages, states = arrays()
    layout = SnapshotLayout(pages, states)
    before = [s.copy() for s in states]
    snapshot = (5, 1, 3)
    layout.copy([(2, snapshot)], restore=False)
    untouched = [p[[0, 2, 4]].copy() for p in pages]
    for s in states:
        s[2] = 0
    layout.copy([(2, snapshot)], restore=True, states={0, 2})
    assert np.array_equal(states[0][2], before[0][2]) and np.array_equal(states[2][2], before[2][2])
    assert not states[1][2].any()  # not named: still cleared
    assert all(np.array_equal(s[:2], b[:2]) for s, b in zip(states, before, strict=True))
    assert all(np.array_equal(p[[0, 2, 4]], u) for p, u in zip(pages, untouched, strict=True))


def test_copy_ranges_moves_each_range_and_nothing_else() -> None:
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros(64, dtype=np.uint8)
    base_s, base_d = src.ctypes.data, dst.ctypes.data
    copy_ranges(
        np.array([base_d + 1, base_d + 40]),
        np.array([base_s + 10, base_s + 50]),
        np.array([7, 3]),
        device=False,
    )
    want = np.zeros(64, dtype=np.uint8)
    want[1:8], want[40:43] = src[10:17], src[50:53]
    assert np.array_equal(dst, want)


def test_a_layout_refuses_arrays_that_are_not_contiguous() -> None:
    pages, states = arrays()
    with pytest.raises(ValueError, match="C-contiguous"):
        SnapshotLayout(pages, [states[0][:, ::2]])


def test_states_are_named_by_their_arrays_and_a_foreign_one_is_refused() -> None:
    pages, states = arrays()
    layout = SnapshotLayout(pages, states)
    assert layout.state_indices([states[2], states[0]]) == [2, 0]
    with pytest.raises(ValueError, match="not this pool's"):
        layout.state_indices([states[0].copy()])


def test_a_layout_holds_its_arrays() -> None:
    """It copies by address and names parts by identity, so it keeps its arrays alive:
    dropped by everyone else, their memory and identities stay theirs."""
    pages, states = arrays()
    layout = SnapshotLayout(pages, states)
    watched = [weakref.ref(a) for a in (*pages, *states)]
    del pages, states
    gc.collect()
    assert all(ref() is not None for ref in watched)
    assert layout.state_indices([watched[-1]()]) == [2]


def test_several_targets_in_one_copy_equal_each_alone() -> None:
    """A round's marks: two slots into two snapshots in one call leave the bytes of the two
    calls one at a time."""
    pages, states = arrays()
    together = SnapshotLayout(pages, states)
    together.copy([(0, (1, 2, 3)), (2, (5, 4, 0))], restore=False, states={0, 2})
    alone_pages, alone_states = arrays()
    alone = SnapshotLayout(alone_pages, alone_states)
    for target in [(0, (1, 2, 3)), (2, (5, 4, 0))]:
        alone.copy([target], restore=False, states={0, 2})
    assert all(np.array_equal(a, b) for a, b in zip(pages, alone_pages, strict=True))
    assert any(p.any() for p in pages)


def test_marks_sharing_a_saver_are_saved_in_one_call() -> None:
    calls = []

    def first(keys, states):
        calls.append(("first", list(keys), states))

    def second(keys, states):
        calls.append(("second", list(keys), states))

    marks = [Mark(3, "a", first), Mark(5, "b", second), Mark(7, "c", first)]
    save_marks(marks, ("s",))
    assert calls == [("first", ["a", "c"], ("s",)), ("second", ["b"], ("s",))]
