"""THE table of the norm family: which provider serves an op on a device, most preferred
first. On CUDA our one-pass kernels replace the several array passes of the reference (and
its temporaries) in every decode step."""

from __future__ import annotations

from collections.abc import Sequence

#: the family's ops
OPS = ("rms_norm", "add_rms_norm", "gated_rms_norm", "sinkhorn")

#: (op, device) -> provider names, most preferred first
TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    **{(op, "cpu"): ("reference",) for op in OPS},
    **{(op, "cuda"): ("nvrtc", "reference") for op in OPS},
}


def choose(op: str, *, device: str, **_: object) -> Sequence[str]:
    try:
        return TABLE[(op, device)]
    except KeyError:
        raise LookupError(f"norm: no policy row for {op!r} on {device!r}") from None
