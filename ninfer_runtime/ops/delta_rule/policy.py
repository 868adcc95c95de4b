"""THE table of the delta_rule family: which provider serves an op on a device, most
preferred first (a provider that is not installed or declines the shapes is skipped). Each
row's order is a measurement: docs/performance.md, "Op providers", has the runs."""

from __future__ import annotations

from collections.abc import Sequence

#: the per-channel-decay variant's ops (Kimi Delta Attention); the reference's array math runs
#: on CuPy arrays as on numpy ones
KDA_OPS = ("kda_chunk", "kda_prefill", "kda_decode", "kda_verify", "kda_commit")

#: (op, device) -> provider names, most preferred first
TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    ("chunk", "cpu"): ("reference",),
    # ours first: in one run (H100, float32, eager as the engine calls it) the 27B's 2,048-token
    # chunk took 1.10 ms against fla's 1.48, and fla pays ~1 ms of launches at any length
    ("chunk", "cuda"): ("nvrtc", "fla", "reference"),
    **{(op, "cpu"): ("reference",) for op in ("prefill", "decode", "verify", "commit")},
    # fla's variable-length prefill is not in the row: in one run (H100) it lost at every
    # shape (the 27B's 2,048 rows 1.77 ms a layer eager against 1.10; its host path ~22 ms a
    # call), and the 27B's 7,680-token prefill ran at 6,212 tok/s on it against 8,028
    **{(op, "cuda"): ("nvrtc", "reference") for op in ("prefill", "decode", "verify", "commit")},
    **{(op, "cpu"): ("reference",) for op in KDA_OPS},
    **{(op, "cuda"): ("reference",) for op in KDA_OPS if op != "kda_chunk"},
    # fla's chunk_kda first: in one run (H100, GLM5Next's shape) 1.03 / 0.94 ms a chunk of
    # 64 / 256 tokens against the reference's 2.07 / 7.78 on the device
    ("kda_chunk", "cuda"): ("fla", "reference"),
}


def choose(op: str, *, device: str, **_: object) -> Sequence[str]:
    try:
        return TABLE[(op, device)]
    except KeyError:
        raise LookupError(f"delta_rule: no policy row for {op!r} on {device!r}") from None
