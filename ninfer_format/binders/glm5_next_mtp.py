"""The parameters of a GLM5Next MTP block, the layout the converter reads (transformers defines
no GLM5Next MTP block, and the binder does not check the ``mtp`` component yet).

DeepSeek-V3's layout: a stem ``mtp/input_projection [H, 2H]`` @ ``mtp/stem_input`` (the
input is ``[embedding_norm(embedding) | hidden_norm(hidden)]``), ``mtp/embedding_norm``,
``mtp/hidden_norm`` and ``mtp/final_norm`` ``[H]``, then one decoder layer ``mtp/layers/0/``
named as the text layers are (``glm5_next``): both hyper-connections, MLA with its own DSA
indexer, and a routed MoE with shared experts. Shapes come from the text geometry read with
``with_mtp``, so MLA, the indexer and MoE are defined even where the text layers have none.
"""

from __future__ import annotations

from collections.abc import Iterator

from .glm5_next import _connection, _indexer, _mla, _moe
from .glm5_next_geometry import Glm5NextGeometry
from .qwen3_5 import ParamSpec, _matrix, _vector

LAYER = "mtp/layers/0/"


def mtp_parameters(g: Glm5NextGeometry) -> Iterator[ParamSpec]:
    """Every MTP parameter; ``g`` must be read ``with_mtp`` (MLA, indexer and MoE present)."""
    if g.mla is None or g.indexer is None or g.moe is None:
        raise ValueError("the GLM5Next MTP block needs a geometry read with_mtp")
    yield _matrix("mtp/input_projection", g.hidden, 2 * g.hidden, "mtp/stem_input")
    yield _vector("mtp/embedding_norm", g.hidden)
    yield _vector("mtp/hidden_norm", g.hidden)
    yield _vector("mtp/final_norm", g.hidden)
    yield from _connection(LAYER + "mixer_connection/", g)
    yield _vector(LAYER + "input_norm", g.hidden)
    yield from _mla(LAYER, g.mla, g.hidden)
    yield from _indexer(LAYER, g.indexer, g.mla, g.hidden)
    yield from _connection(LAYER + "ffn_connection/", g)
    yield _vector(LAYER + "post_attention_norm", g.hidden)
    yield from _moe(LAYER, g.moe, g.hidden)
