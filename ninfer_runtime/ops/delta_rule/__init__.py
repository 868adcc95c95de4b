"""The delta rule of Gated DeltaNet layers, in its chunked form (a prefill of T tokens).

Op ``chunk``: ``(q, k, v, g, beta, state) -> out``: q, k [T, Hk, dk] (l2-normalised, q already
scaled), v [T, Hv, dv], log-decay g and write strength beta [T, Hv], state [Hv, dk, dv] float32
updated in place; value head h reads key head ``h // (Hv / Hk)``; out [T, Hv, dv].

Providers: ``reference`` (the array math of ``reference.py``, numpy or CuPy: the oracle),
``nvrtc`` (ours: ``kernels/gdn_prefill.cu``, three launches) and ``fla`` (flash-linear-
attention's ``chunk_gated_delta_rule``, pip ``fla-core``, through DLPack views). Which serves
an op is ``policy.TABLE``.
"""

from ..registry import Provider, family, register
from .policy import choose

family("delta_rule", choose)
for _name, _module, _requires in (
    ("reference", "reference", ()),
    ("nvrtc", "nvrtc", ("cupy",)),
    ("fla", "fla", ("cupy", "torch", "fla")),
):
    register(
        Provider(
            family="delta_rule",
            op="chunk",
            name=_name,
            module=f"{__name__}.{_module}",
            function="chunk",
            requires=_requires,
            accepts="accepts",
        )
    )
