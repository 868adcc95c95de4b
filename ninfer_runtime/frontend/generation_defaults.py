"""The sampling defaults a model's publisher put in ``generation_config.json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_runtime.frontend._errors import artifact_error
from ninfer_runtime.frontend._resources import GENERATION_CONFIG

__all__ = ["sampling_defaults"]

#: generation_config fields that are sampling defaults, with the type each must have.
_SAMPLING_FIELDS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
}


def sampling_defaults(generation_config: Mapping[str, Any]) -> dict[str, float | int]:
    """Sampling fields of generation_config, named as ``SamplingParams`` names them.

    An explicit ``do_sample: false`` means the publisher wants greedy decoding, so it becomes
    ``temperature = 0``; an absent ``do_sample`` is not read as greedy (vLLM behaves the same).
    """
    defaults: dict[str, float | int] = {}
    for key, kind in _SAMPLING_FIELDS.items():
        value = generation_config.get(key)
        if value is None:
            continue
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if kind is int:
            ok = ok and float(value).is_integer()
        if not ok:
            raise artifact_error(GENERATION_CONFIG, f"{key} must be a number, got {value!r}")
        defaults[key] = kind(value)
    if generation_config.get("do_sample") is False:
        defaults["temperature"] = 0.0
    max_new = generation_config.get("max_new_tokens")
    if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new >= 1:
        defaults["max_tokens"] = max_new
    return defaults
