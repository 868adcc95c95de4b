"""THE table of the moe family: which provider serves an op on a device, most preferred
first. On CUDA the block has one provider, ours (its decode, prefill and read-back paths are
chosen inside it by rows and expert formats; it routes with its own kernel); the softmax
router alone on that kernel too, GLM5Next's grouped router the reference's, its routed experts
on our expert GEMVs; the host's expert products are torch's beside a GPU."""

from __future__ import annotations

from collections.abc import Sequence

#: (op, device) -> provider names, most preferred first
TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    ("block", "cpu"): ("reference",),
    ("block", "cuda"): ("nvrtc",),
    # expert offload's split routes with it: on CUDA the block's own router kernel, one
    # launch where the reference's sort takes several, its choice the block's (the provider
    # against the reference: tests/gpu/test_moe_kernels.py, passed on an H100 at 28327af)
    ("route", "cpu"): ("reference",),
    ("route", "cuda"): ("nvrtc", "reference"),
    ("grouped_route", "cpu"): ("reference",),
    ("grouped_route", "cuda"): ("reference",),
    ("routed_experts", "cpu"): ("reference",),
    # ours: every pair in two expert-GEMV launches, nothing read back, where the reference's
    # loop reads the choices back and runs an expert at a time (tests/gpu/test_moe_routed.py;
    # GLM5Next's decode 2.3x faster at one lane, 3x at eight: docs/performance.md)
    ("routed_experts", "cuda"): ("nvrtc", "reference"),
    # the products of expert offload's host experts, keyed by the engine's device: beside the
    # CPU backend the host computes as its float32 oracle does; beside a GPU, in the GPU
    # path's production precision on torch's CPU int4 kernel (the formats host_codes reads;
    # others: reference)
    ("host_products", "cpu"): ("reference",),
    ("host_products", "cuda"): ("torch_int4", "reference"),
}


def choose(op: str, *, device: str, **_: object) -> Sequence[str]:
    try:
        return TABLE[(op, device)]
    except KeyError:
        raise LookupError(f"moe: no policy row for {op!r} on {device!r}") from None
