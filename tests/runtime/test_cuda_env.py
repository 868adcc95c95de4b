"""The CUDA backend's environment settings, read without a GPU (or CuPy: the decode choices are
``backend.DECODE_PRODUCTS``' keys, written out here)."""

from __future__ import annotations

import pytest

from ninfer_runtime.backends.cuda import DECODE_ENV
from ninfer_runtime.backends.cuda.env import env_choice
from ninfer_runtime.backends.cuda.prefill import ENV, PRECISIONS, precision_from_env

DECODE_CHOICES = ("split", "bf16")


def test_a_setting_is_its_default_unset_and_read_whatever_its_case() -> None:
    assert env_choice(DECODE_ENV, DECODE_CHOICES, "bf16", {}) == "bf16"
    assert env_choice(DECODE_ENV, DECODE_CHOICES, "bf16", {DECODE_ENV: " Split "}) == "split"
    assert precision_from_env({ENV: ""}) == "bf16" and "float32" in PRECISIONS


def test_a_bad_value_is_refused_in_one_line_naming_the_variable() -> None:
    with pytest.raises(ValueError) as decode:
        env_choice(DECODE_ENV, DECODE_CHOICES, "bf16", {DECODE_ENV: "fp8"})
    assert str(decode.value) == "NINFER_CUDA_DECODE='fp8': expected one of split, bf16"
    with pytest.raises(ValueError) as prefill:
        precision_from_env({ENV: "fp16"})
    assert str(prefill.value) == "NINFER_CUDA_PREFILL='fp16': expected one of bf16, tf32, float32"
