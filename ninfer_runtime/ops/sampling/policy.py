"""THE table of the sampling family: which provider scores tokens on a device, most preferred
first. On CUDA the kernel took top_logprobs=5 from +17.8% to +2.8% of a 27B decode step
(docs/performance.md, "Log-probabilities and n samples on the 27B")."""

from __future__ import annotations

from collections.abc import Sequence

#: (op, device) -> provider names, most preferred first
TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    ("score", "cpu"): ("reference",),
    ("score", "cuda"): ("nvrtc", "reference"),
}


def choose(op: str, *, device: str, **_: object) -> Sequence[str]:
    try:
        return TABLE[(op, device)]
    except KeyError:
        raise LookupError(f"sampling: no policy row for {op!r} on {device!r}") from None
