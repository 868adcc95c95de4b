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
    **{(op, "cuda"): ("nvrtc", "reference") for op in ("prefill", "decode", "verify", "commit")},
    **{(op, "cpu"): ("reference",) for op in KDA_OPS},
    **{(op, "cuda"): ("reference",) for op in KDA_OPS if op != "kda_chunk"},
    # the reference first: fla's chunk_kda passed its GPU test (test_delta_rule_providers.py,
    # on an H100) but has not yet been timed beside it (delta_rule_bench.py)
    ("kda_chunk", "cuda"): ("reference", "fla"),
}


def choose(op: str, *, device: str, **_: object) -> Sequence[str]:
    try:
        return TABLE[(op, device)]
    except KeyError:
        raise LookupError(f"delta_rule: no policy row for {op!r} on {device!r}") from None
