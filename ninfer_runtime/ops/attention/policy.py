"""THE table of the attention family: which provider serves an op on a device, most preferred
first (a provider that is not installed or declines the key is skipped). Each row's order is
a measurement: docs/performance.md, "Op providers"."""

from __future__ import annotations

from collections.abc import Sequence

#: (op, device) -> provider names, most preferred first
TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    ("prefill", "cpu"): ("reference",),
    # torch's fused attention first: 1.7-4x faster than ours in one run at every chunk start;
    # it declines the split-precision modes (tf32, float32), which ours serves
    ("prefill", "cuda"): ("sdpa", "nvrtc", "reference"),
    ("prefill_lanes", "cpu"): ("each",),
    # a packed step's lanes in one call a layer, where the lane-by-lane path makes a call
    # and a gather a lane (the agent workload's follower step, docs/performance.md)
    ("prefill_lanes", "cuda"): ("varlen", "each"),
    **{(op, "cpu"): ("reference",) for op in ("write", "decode")},
    **{(op, "cuda"): ("nvrtc", "reference") for op in ("write", "decode")},
    ("latent", "cpu"): ("reference",),
    # the reference's array math on the device (GLM5Next's latent attention; not yet run there)
    ("latent", "cuda"): ("reference",),
    ("segment", "cpu"): ("reference",),
    # torch's fused attention where it takes the key (bf16 products, as the prefill's row);
    # not yet measured against the reference on a GPU
    ("segment", "cuda"): ("sdpa", "reference"),
}


def choose(op: str, *, device: str, **_: object) -> Sequence[str]:
    try:
        return TABLE[(op, device)]
    except KeyError:
        raise LookupError(f"attention: no policy row for {op!r} on {device!r}") from None
