"""Per-layer decode time on a reduced artifact (``ninfer-bench synth --layers N``), and the whole
model's step extrapolated from it by kind of layer (``architectures.extrapolate``).

A layer's time is what leaving it out of the step saves: the plain step's time less that of
the same step with the layer bypassed (it returns what its first call returned, and does no
per-layer host work before the step). The step stays what it is otherwise (captured where the
model's steps are, with every other layer's host work), so a captured step's layers are not
charged the launches an eager call would pay, and an eager step's are. The whole model's bytes
per step are extrapolated the same way: the kept layers' bytes by kind, times each kind's
count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runner import ModelRunner
from . import measure as M
from .active_bytes import ActiveWeights, layer_context_bytes
from .architectures import extrapolate


class _Bypassed:
    """A decoder layer left out of the step: its first call runs the layer (the step's first,
    eager, run) and every later call returns those outputs. It answers for the layer (its
    weights, for the step's bytes) but has no work before the step (a Qwen4Exp layer's
    streamed n-gram rows, read for the layers whose ``ple`` is set)."""

    ple = None

    def __init__(self, layer: Any):
        self._layer, self._outputs = layer, None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._outputs is None:
            self._outputs = self._layer(*args, **kwargs)
        return self._outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


def layer_ms(
    runner: ModelRunner, lanes: int, context: int, kv_dtype: str, steps: int
) -> list[float]:
    """Mean ms per decode step of each decoder layer, at ``lanes`` lanes and ``context``: the
    step's time less that of the step with the layer bypassed."""
    model = runner.model
    layers = list(model.layers)

    def step_ms(bypassed: int | None) -> float:
        model.layers = [_Bypassed(x) if i == bypassed else x for i, x in enumerate(layers)]
        try:  # a fresh runner: its steps are made (and captured) with this list of layers
            rate = M.decode_rate(
                ModelRunner(model), lanes, context, steps=steps, floor_bw=1.0, kv_dtype=kv_dtype
            )
        finally:
            model.layers = layers
        return rate.step_ms

    # the whole step timed before and after the bypassed ones, so a drift of the machine's
    # speed over the runs lands in neither end's layers alone
    first = step_ms(None)
    bypassed = [step_ms(i) for i in range(len(layers))]
    whole = (first + step_ms(None)) / 2
    return [whole - ms for ms in bypassed]


@dataclass
class Extrapolation:
    """A decode row of a reduced artifact and the whole model's step extrapolated from it."""

    lanes: int
    context: int
    step_ms: float  # measured, on the reduced artifact
    layer_ms: dict[str, float]  # kind -> mean measured ms of one layer of it
    whole_layers: int
    whole_step_ms: float  # extrapolated
    whole_bytes_per_step: int  # extrapolated
    whole_floor_ms: float

    @property
    def whole_tokens_per_s(self) -> float:
        return 1e3 * self.lanes / self.whole_step_ms

    @property
    def whole_percent_of_floor(self) -> float:
        return 100 * self.whole_floor_ms / self.whole_step_ms


def extrapolate_row(
    runner: ModelRunner,
    reduced: dict[str, Any],
    weights: ActiveWeights,
    row: M.DecodeResult,
    *,
    kv_dtype: str,
    steps: int,
    floor_bw: float,
) -> Extrapolation:
    """The whole model's step at ``row``'s lanes and context, from its layers' measured times
    and bytes (``reduced``: the artifact's provenance record of its reduction)."""
    kinds, whole = reduced["kinds"], reduced["whole_kinds"]
    lanes, context = row.lanes, row.context
    times = layer_ms(runner, lanes, context, kv_dtype, steps)
    means, whole_ms = extrapolate(row.step_ms, times, kinds, whole)
    model = runner.model
    per_layer = [
        weights.layer(i, lanes) + layer_context_bytes(model, i, lanes, context, kv_dtype)
        for i in range(len(kinds))
    ]
    step_bytes = float(weights.outside(lanes) + sum(per_layer))
    _, whole_bytes = extrapolate(step_bytes, per_layer, kinds, whole)
    return Extrapolation(
        lanes, context, row.step_ms, means, sum(whole.values()), whole_ms, int(whole_bytes),
        1e3 * whole_bytes / floor_bw,
    )  # fmt: skip


def lines(e: Extrapolation) -> list[str]:
    """The per-layer times and the extrapolated step, each said as what it is."""
    kinds = ", ".join(f"{k} {ms:.2f}" for k, ms in e.layer_ms.items())
    return [
        f"  lanes {e.lanes}, context {e.context}: per layer, measured (ms/step): {kinds}",
        f"  whole model ({e.whole_layers} layers), EXTRAPOLATED from the layers above: "
        f"{e.whole_step_ms:.2f} ms/step, {e.whole_tokens_per_s:.1f} tok/s; "
        f"{e.whole_bytes_per_step / 1e9:.2f} GB/step, floor {e.whole_floor_ms:.2f} ms "
        f"({e.whole_percent_of_floor:.1f}% of floor)",
    ]
