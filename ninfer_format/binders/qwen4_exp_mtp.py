"""The parameters of a Qwen4Exp MTP block, the layout the converter reads (transformers defines
no Qwen4Exp MTP block, and the binder does not check the ``mtp`` component yet).

Qwen3.5's MTP stem with the hidden state of all ``hc_count`` streams: ``mtp/input_projection
[H, 2H]`` @ ``mtp/stem_input``, ``mtp/embedding_norm [H]``, ``mtp/hidden_norm [hc·H]``; then
``layers`` decoder layers ``mtp/layers/{i}/`` named as the text layers are (``qwen4_exp``):
both hyper-connections, attention (with its own QSA indexer unless ``with_indexer`` is False:
an MTP layer may read the target's index) and the MoE, never PLE; and the block's own final
mixer ``mtp/final_connection/norm|down|up``, as the text model's. Shapes come from the text
geometry read ``with_mtp``, so attention and the indexer are defined even where the text
layers have none.
"""

from __future__ import annotations

from collections.abc import Iterator

from .parameter_spec import ParamSpec, _matrix, _vector
from .qwen4_exp import _connection, _decoder_layer
from .qwen4_exp_geometry import INDEXED_ATTENTION, Qwen4ExpGeometry

#: the mtp component's architecture (no transformers class exists; the name says the layout)
MTP_ARCHITECTURE = "Qwen4ExpMTP"

#: a decoder layer index no ``ple_layer_ids`` entry can name: the layer template without PLE
_TEMPLATE = -1


def _renamed(spec: ParamSpec, old: str, new: str) -> ParamSpec:
    inputs = tuple(new + i.removeprefix(old) if i.startswith(old) else i for i in spec.inputs)
    return ParamSpec(new + spec.name.removeprefix(old), spec.shape, spec.role, inputs)


def mtp_parameters(
    g: Qwen4ExpGeometry, *, layers: int = 1, with_indexer: bool = True
) -> Iterator[ParamSpec]:
    """Every MTP parameter; ``g`` must be read ``with_mtp`` (attention and indexer present)."""
    if g.attention is None or g.indexer is None:
        raise ValueError("the Qwen4Exp MTP block needs a geometry read with_mtp")
    yield _matrix("mtp/input_projection", g.hidden, 2 * g.hidden, "mtp/stem_input")
    yield _vector("mtp/embedding_norm", g.hidden)
    yield _vector("mtp/hidden_norm", g.streams_width)
    template = f"text/layers/{_TEMPLATE}/"
    for i in range(layers):
        for spec in _decoder_layer(_TEMPLATE, INDEXED_ATTENTION, g):
            if with_indexer or "/indexer/" not in spec.name:
                yield _renamed(spec, template, f"mtp/layers/{i}/")
    yield from _connection("mtp/final_connection/", g, inject=False)
