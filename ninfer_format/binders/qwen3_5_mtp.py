"""The Qwen3.5 MTP component (spec 5.3): its identity checks and its block's parameters."""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..schema import Directory
from .config_reader import MISSING, show
from .parameter_spec import ParamSpec, _matrix, _vector
from .qwen3_5_geometry import DENSE, FULL_ATTENTION, MOE
from .qwen3_5_geometry import Qwen35Geometry as Geometry
from .qwen3_5_layers import _decoder_layer
from .registry import Findings

MTP_ARCHITECTURE_OF = {DENSE: "Qwen3_5MTP", MOE: "Qwen3_5MoeMTP"}


def _mtp_stem(hidden: int) -> Iterator[ParamSpec]:
    """The stem and final norm (also GLM5Next's, whose MTP layer differs)."""
    # Concat order of the stem input is embedding first, hidden second: [H, 2H].
    yield _matrix("mtp/input_projection", hidden, 2 * hidden, "mtp/stem_input")
    yield _vector("mtp/embedding_norm", hidden)
    yield _vector("mtp/hidden_norm", hidden)
    yield _vector("mtp/final_norm", hidden)


def _mtp(g: Geometry) -> Iterator[ParamSpec]:
    yield from _mtp_stem(g.hidden)
    yield from _decoder_layer("mtp/layers/0/", FULL_ATTENTION, g)


def _check_mtp_component(directory: Directory, model_type: str, findings: Findings) -> None:
    mtp = directory.components["mtp"]
    expected = [MTP_ARCHITECTURE_OF[model_type]]
    architectures = mtp.config.get("architectures", MISSING)
    if architectures != expected:
        findings.error(
            f"mtp config member 'architectures' must be {json.dumps(expected)} with a"
            f" {model_type} text component, got {show(architectures)}"
        )
    if mtp.target != "text":
        findings.error(f'mtp component must have target "text", got {show(mtp.target)}')
