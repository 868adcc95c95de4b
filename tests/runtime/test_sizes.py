"""Sizes in messages (``ninfer_runtime.sizes.format_size``) at the edges of their units."""

from __future__ import annotations

from ninfer_runtime.sizes import format_size


def test_a_size_that_rounds_up_to_the_next_unit_is_shown_in_it() -> None:
    assert format_size(2**20 - 1) == "1 MiB"
    assert format_size(2**30 - 512) == "1 GiB"
    assert format_size(1023 * 1024) == "1023 KiB"  # whole below the next unit: stays
    assert format_size(10 * 1024 - 1) == "10 KiB"
    assert format_size(1024 - 1) == "1023 B"
    assert format_size(3 * 2**50) == "3072 TiB"  # the largest unit takes any count
