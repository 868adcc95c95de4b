"""The delta rule of Gated DeltaNet layers: a linear-attention recurrence whose state
[Hv, dk, dv] per lane is written by each token (value head h reads key head ``h // (Hv / Hk)``).

Ops (signatures as the reference's, ``reference.py``):

* ``chunk``: ``(q, k, v, g, beta, state) -> out``: T tokens in the chunked form: q, k
  [T, Hk, dk] (l2-normalised, q already scaled), v [T, Hv, dv], log-decay g and write strength
  beta [T, Hv], state float32 updated in place; out [T, Hv, dv];
* ``prefill``: the rows of one or more lanes stacked, from the projected [q | k | v]
  channels, each lane a segment (first row, rows, slot) continuing its slot's states: the
  causal convolution, SiLU, the q/k normalisation, then ``chunk``;
* ``decode``: one token per lane, states addressed by slot;
* ``verify`` / ``commit``: a speculative round's tokens from unchanged states (their inputs
  recorded), then the first accepted ones folded in;
* ``kda_chunk``, ``kda_prefill``, ``kda_decode``, ``kda_verify``, ``kda_commit``: the same
  five for the per-channel-decay variant (Kimi Delta Attention: g [T, H, dk], query, key and
  value heads alike, dims ``heads`` and ``head_dim``), ``kda_reference.py``.

Providers: ``reference`` (the oracle; ``kda_reference`` for the KDA ops, both on ``conv.py``'s
convolution and split into heads and ``loops.py``'s scan, verification and commit loops, each
around its own step), ``nvrtc`` (ours: ``kernels/gdn.cu``, ``kernels/gdn_prefill.cu``; of
the KDA ops, ``kda_decode``) and
``fla`` (flash-linear-attention's ``chunk_gated_delta_rule`` and ``chunk_kda``, pip
``fla-core``, through DLPack views; ``chunk``, ``kda_chunk``, and ``prefill``: our
convolution kernel, then every lane's rows in one variable-length call in bf16). Which
serves an op is ``policy.TABLE``; the resolution key is the device, ``key_dim``,
``value_dim``, the convolution's ``taps`` and a prefill call's size class (``policy.size_class``:
rows x value heads).
"""

from collections.abc import Callable
from typing import Any

from ..registry import Provider, family, register, resolve
from .policy import KDA_OPS, choose, size_class

__all__ = ["resolved"]


def resolved(
    op: str,
    device: str,
    kernel: Any,
    *,
    key_dim: int,
    value_dim: int,
    rows: int = 0,
    value_heads: int = 0,
    **_: int,
) -> Callable[..., Any]:
    """``op`` for a layer on ``device`` with this convolution kernel [K, C] and head sizes,
    for a call of ``rows`` rows (a prefill's size class; the other keywords, e.g. the rest of
    the layer's ``dims``, are ignored)."""
    taps = int(kernel.shape[0])
    size = size_class(op, rows, value_heads)
    return resolve(
        "delta_rule", op, device=device, key_dim=key_dim, value_dim=value_dim, taps=taps, size=size
    )


family("delta_rule", choose)
#: (op, provider) -> (module, its accepts function, libraries it needs)
_PROVIDERS = {
    **{(op, "reference"): ("reference", "accepts", ()) for op in
       ("chunk", "prefill", "decode", "verify", "commit")},
    ("chunk", "nvrtc"): ("nvrtc", "accepts_chunk", ("cupy",)),
    ("prefill", "nvrtc"): ("nvrtc", "accepts_prefill", ("cupy",)),
    **{(op, "nvrtc"): ("nvrtc", "accepts_step", ("cupy",)) for op in
       ("decode", "verify", "commit", "kda_decode")},
    ("chunk", "fla"): ("fla", "accepts", ("cupy", "torch", "fla")),
    ("prefill", "fla"): ("fla", "accepts_prefill", ("cupy", "torch", "fla")),
    **{(op, "reference"): ("kda_reference", "accepts", ()) for op in KDA_OPS},
    ("kda_chunk", "fla"): ("fla", "accepts", ("cupy", "torch", "fla")),
}  # fmt: skip
for (_op, _name), (_module, _accepts, _requires) in _PROVIDERS.items():
    register(
        Provider(
            family="delta_rule",
            op=_op,
            name=_name,
            module=f"{__name__}.{_module}",
            function=_op,
            requires=_requires,
            accepts=_accepts,
        )
    )
