"""Normalisations over the last axis, float32 (signatures as the reference's,
``reference.py``):

* ``rms_norm``: ``(x, w, eps, offset) -> y``: ``x / sqrt(mean(x²) + eps) * (w + offset)``;
  ``offset`` is 1.0 for Qwen3.5's zero-centred norms (stored w starts at 0), 0.0 for plain
  weights;
* ``add_rms_norm``: ``(h, delta, w, eps, offset) -> (s, y)``: the residual add and the norm of
  its result in one op, ``s = h + delta``, the same values as the two apart;
* ``gated_rms_norm``: ``(x, gate, w, eps) -> y``: Gated DeltaNet's output norm,
  ``silu(gate) * rms_norm(x, w, eps, 0)`` over x [T, heads, d] (gate may be a strided view);
* ``sinkhorn``: ``(logits, *, iterations, eps) -> comb``: GLM5Next's hyper-connection mixing,
  the softmax of each row of [..., n, n] logits plus eps, made nearly doubly stochastic.

Models resolve them on each call, keyed by the backend's device
(``resolve("norm", "rms_norm", device=backend.name)``). Providers: ``reference`` (array math, either
device) and ``nvrtc`` (ours: ``kernels/glue.cu``). Which serves an op is ``policy.TABLE``; the
resolution key is the device.
"""

from ..registry import Provider, family, register
from .policy import OPS, choose

family("norm", choose)
for _op in OPS:
    for _name, _requires in (("reference", ()), ("nvrtc", ("cupy",))):
        register(
            Provider(
                family="norm",
                op=_op,
                name=_name,
                module=f"{__name__}.{_name}",
                function=_op,
                requires=_requires,
                accepts="accepts",
            )
        )
