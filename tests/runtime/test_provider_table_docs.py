"""docs/runtime.md's table "op x device -> providers" says what the policy tables say: for
every row of a family's policy (but the linear family's, whose order follows the layout, M and
size, and is a paragraph of its own), a row of the docs table with that family, op and device
names its providers in the policy's order. A docs row may name several ops (``write``,
``decode``), several devices (``cpu, cuda``), or every (other) op of a device; a provider is a
backticked name registered for that family, in the order the row first gives them (file
names and library functions between them are not providers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninfer_runtime.ops import registry
from tests.runtime.test_op_registry import FAMILIES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"
TICKED = re.compile(r"`([A-Za-z_0-9]+)`")
CELL_EDGE = re.compile(r"(?<!\\)\|")  # a pipe, but not markdown's escaped one inside a cell


def docs_rows(family: str) -> dict[tuple[str, str], list[list[str]]]:
    """(op, device) -> the provider lists of the docs rows of ``family`` that name them."""
    registered = registry.providers(family)
    names = {name for by_name in registered.values() for name in by_name}
    rows: dict[tuple[str, str], list[list[str]]] = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in CELL_EDGE.split(line.strip().strip("|"))]
        if len(cells) < 4 or cells[0] != f"`{family}`":
            continue
        ops_cell, devices, providers = cells[1], cells[2], cells[3]
        every = ops_cell in ("every op", "every other op")
        ops = list(registered) if every else TICKED.findall(ops_cell)
        listed = [t for t in TICKED.findall(providers) if t in names]
        for op in (o for o in ops if o in registered):
            for device in (d.strip() for d in devices.split(",")):
                rows.setdefault((op, device), []).append(listed)
    return rows


def in_order(want: tuple[str, ...], listed: list[str]) -> bool:
    """Whether ``listed`` holds ``want`` one after another (a row that gives a size class's
    order, then another's, holds each)."""
    n = len(want)
    return any(tuple(listed[i : i + n]) == want for i in range(len(listed) - n + 1))


@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if f != "linear"))
def test_the_docs_table_names_each_policy_rows_providers_in_order(family: str) -> None:
    table, _ = FAMILIES[family]
    rows = docs_rows(family)
    for (op, device, *size), want in table.items():
        found = rows.get((op, device))
        assert found, f"docs/runtime.md: no row for {family}.{op} on {device}"
        assert any(in_order(tuple(want), listed) for listed in found), (
            f"docs/runtime.md: {family}.{op} on {device}{' ' + size[0] if size else ''} lists "
            f"{found}, the policy {list(want)}"
        )
