"""THE table of the delta_rule family: which provider serves an op on a device, most
preferred first (a provider that is not installed or declines the shapes is skipped). Each
row's order is a measurement: docs/performance.md, "Op providers", has the runs."""

from __future__ import annotations

from collections.abc import Sequence

#: the per-channel-decay variant's ops (Kimi Delta Attention); the reference's array math runs
#: on CuPy arrays as on numpy ones
KDA_OPS = ("kda_chunk", "kda_prefill", "kda_decode", "kda_verify", "kda_commit")

#: a prefill call of at least this many rows x value heads is "bulk": fla's variable-length
#: kernel pays its host cost a call back there and loses below (measured points below)
BULK_PREFILL = 2048 * 48

#: (op, device) or (op, device, "bulk") -> provider names, most preferred first
TABLE: dict[tuple[str, ...], tuple[str, ...]] = {
    ("chunk", "cpu"): ("reference",),
    # ours first: in one run (H100, float32, eager as the engine calls it) the 27B's 2,048-token
    # chunk took 1.10 ms against fla's 1.48, and fla pays ~1 ms of launches at any length
    ("chunk", "cuda"): ("nvrtc", "fla", "reference"),
    **{(op, "cpu"): ("reference",) for op in ("prefill", "decode", "verify", "commit")},
    **{(op, "cuda"): ("nvrtc", "reference") for op in ("prefill", "decode", "verify", "commit")},
    # fla first for bulk prefill: in one run (H100, 7,680-token prompts) the 27B (48 value
    # heads) prefilled 8,847 / 9,744 tok/s on it at 2,048- / 4,096-row chunks against 7,943 /
    # 8,723 on ours, and the 35B-A3B (32) 29,735 against 25,413 at 4,096 rows, but 18,929
    # against 22,203 at 2,048: below BULK_PREFILL its host cost is not paid back
    ("prefill", "cuda", "bulk"): ("fla", "nvrtc", "reference"),
    **{(op, "cpu"): ("reference",) for op in KDA_OPS},
    **{(op, "cuda"): ("reference",) for op in KDA_OPS if op not in ("kda_chunk", "kda_decode")},
    # the reference first until ours (``kda_step``, two launches where the array math takes
    # dozens) has run on a GPU (tests/gpu/test_delta_rule_providers.py) and been measured
    ("kda_decode", "cuda"): ("reference", "nvrtc"),
    # fla's chunk_kda first: in one run (H100, GLM5Next's shape) 1.03 / 0.94 ms a chunk of
    # 64 / 256 tokens against the reference's 2.07 / 7.78 on the device
    ("kda_chunk", "cuda"): ("fla", "reference"),
}


def size_class(op: str, rows: int, value_heads: int) -> str:
    """The policy's size class of a call: "bulk" for a prefill of at least
    ``BULK_PREFILL`` rows x value heads, else ""."""
    return "bulk" if op == "prefill" and rows * value_heads >= BULK_PREFILL else ""


def choose(op: str, *, device: str, size: str = "", **_: object) -> Sequence[str]:
    row = TABLE.get((op, device, size)) if size else None
    if row is not None:
        return row
    try:
        return TABLE[(op, device)]
    except KeyError:
        raise LookupError(f"delta_rule: no policy row for {op!r} on {device!r}") from None
