"""Token scores: what the sampler's rows say about the tokens it chose.

Op ``score``: ``(rows, chosen, k) -> packed``: per row of float32 logits [N, V] (numpy or
CuPy, where the logits are), the log-probability of token ``chosen[i]`` and those of the row's
``k`` most likely tokens (largest first, ties lowest id first) with their ids, as one float64
host array [N, 1 + 2k] (ids are exact in float64 for any vocabulary): only those numbers cross
to the host. Log-probabilities are ``reference.log_softmax``'s.

Providers: ``reference`` (array math on either device: the normaliser, then k rounds of
argmax each masking the one it found) and ``nvrtc`` (ours: one kernel, ``score_tokens`` in
``backends/cuda/kernels/sampling.cu``, up to 20 tops, float32 rows with unit column stride).
The resolution key is the device, ``top`` (k) and whether the rows are float32 with unit
column stride. Token selection itself is the device's sampler (``Backend.device_sampler``).
"""

from ..registry import Provider, family, register
from .policy import choose

family("sampling", choose)
for _name, _requires in (("reference", ()), ("nvrtc", ("cupy",))):
    register(
        Provider(
            family="sampling",
            op="score",
            name=_name,
            module=f"{__name__}.{_name}",
            function="score",
            requires=_requires,
            accepts="accepts",
        )
    )
