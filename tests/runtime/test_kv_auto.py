"""``kv_dtype = "auto"``: each backend's own K/V storage, known before a backend exists."""

from __future__ import annotations

import pytest

from ninfer_runtime.errors import EngineError
from ninfer_runtime.kv_storage import KV_DTYPES, resolve_kv_dtype
from ninfer_serve.config import load_settings


def test_auto_is_the_backends_own_and_a_named_dtype_stays() -> None:
    assert resolve_kv_dtype("auto", "cpu") == "float32"  # the oracle
    assert resolve_kv_dtype("auto", "cuda") == "bfloat16"  # known without CuPy
    for name in KV_DTYPES:
        assert resolve_kv_dtype(name, "cuda") == name
    with pytest.raises(EngineError, match=r"^kv_dtype 'fp16': expected one of auto, "):
        resolve_kv_dtype("fp16", "cpu")


def test_the_servers_setting_resolves_at_its_backend() -> None:
    """A given ``auto`` is resolved with the settings; unset, it reaches the engine as auto."""
    cuda = {"backend": "cuda", "kv_dtype": "auto"}
    assert load_settings(None, {"engine": cuda}).engine.kv_dtype == "bfloat16"
    assert load_settings(None, {"engine": {"kv_dtype": "auto"}}).engine.kv_dtype == "float32"
    assert load_settings(None, {"engine": {}}).engine.kv_dtype == "auto"
    pinned = {"backend": "cuda", "kv_dtype": "float32"}
    assert load_settings(None, {"engine": pinned}).engine.kv_dtype == "float32"
