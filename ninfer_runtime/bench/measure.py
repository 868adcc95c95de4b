"""The measuring half of ``ninfer-bench``: decode and prefill rates beside their floors.

Decode is memory-bound, so its floor is the bytes one step must move (every weight read
once, the routed experts' share of the MoE weights, each lane's K/V up to its context, GDN
states read and written) at the bandwidth of a device-to-device copy measured in the same
run. Prefill is compute-bound; its floor is the projections' FLOPs at the rate of a large
half-precision cuBLAS matrix product measured the same way. "% of floor" is floor time over
measured time.

The parts live in modules of their own (``probes``: the device's rates; ``costs``: bytes
and FLOPs; ``results``: the rows; ``rates``, ``spec_rates``, ``acceptance``: the timed
runs; ``ablation``: where the time goes); this module gathers them under one name, the one
``ninfer-bench``, the benchmarks and the scripts import.
"""

from __future__ import annotations

from .ablation import (
    FAMILY_OPS,
    PREFILL_OPS,
    PROFILED_OPS,
    ROUND_OPS,
    profile_decode,
    profile_prefill,
    profile_round,
)
from .acceptance import DEMO_PROMPTS, measure_acceptance
from .costs import (
    decode_step_bytes,
    draft_head,
    draft_step_bytes,
    prefill_flops,
    round_bytes,
    weight_bytes,
)
from .probes import COPY_BYTES, CPU_COPY_BYTES, copy_bandwidth, matmul_rate
from .rates import DECODE_WARMUP, decode_rate, long_prefill, prefill_rate
from .results import (
    ACCEPTANCE_RATES,
    AcceptanceResult,
    DecodeResult,
    DraftStepResult,
    PrefillResult,
    PrefillSegment,
    SpecResult,
    as_row,
    expected_tokens,
)
from .spec_rates import draft_step_rate, spec_round_rate

__all__ = [
    "ACCEPTANCE_RATES",
    "COPY_BYTES",
    "CPU_COPY_BYTES",
    "DECODE_WARMUP",
    "DEMO_PROMPTS",
    "FAMILY_OPS",
    "PREFILL_OPS",
    "PROFILED_OPS",
    "ROUND_OPS",
    "AcceptanceResult",
    "DecodeResult",
    "DraftStepResult",
    "PrefillResult",
    "PrefillSegment",
    "SpecResult",
    "as_row",
    "copy_bandwidth",
    "decode_rate",
    "decode_step_bytes",
    "draft_head",
    "draft_step_bytes",
    "draft_step_rate",
    "expected_tokens",
    "long_prefill",
    "matmul_rate",
    "measure_acceptance",
    "prefill_flops",
    "prefill_rate",
    "profile_decode",
    "profile_prefill",
    "profile_round",
    "round_bytes",
    "spec_round_rate",
    "weight_bytes",
]
