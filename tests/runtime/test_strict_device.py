"""The CUDA paths' host/device discipline, checked on the CPU (``tests/strict_device.py``): the
harness refuses what CuPy refuses, and Qwen3.5 (dense and MoE), Qwen4Exp and GLM5Next run on the
strict backend (the CPU backend under the ``cuda`` name, its arrays refusing host arrays as
CuPy's do) and give the CPU backend's logits.

Each model runs two lanes of one pool: prompts prefilled in chunks (one longer than the
attention budget where the model has one: QSA's, the DSA indexer's), a three-row step of both
lanes (a compiled step) and decode steps of both; every row's logits equal the CPU's to float32
rounding (the same numpy math, on views of the same memory)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.arrays import array_module
from ninfer_runtime.backends.base import to_numpy
from ninfer_runtime.models import load_model
from ninfer_runtime.models.qwen4_exp import model as qwen4_exp_model
from ninfer_runtime.runner import ModelRunner
from tests.strict_device import DeviceArray, refusing_implicit_copies, strict_cuda, xp

#: decode steps after the three-row step
DECODE_STEPS = 3
#: float32 rounding of logits of order 10 (the same math on the same values: equal in practice)
LOGIT_TOL = 1e-5


# ------------------------------------------------------------------------------- harness
def test_device_functions_and_operators_refuse_host_arrays() -> None:
    device, host = xp.ones((2, 3), dtype=np.float32), np.ones((2, 3), dtype=np.float32)
    refused: list[Callable[[], Any]] = [
        lambda: xp.concatenate([device, host]),  # nested in a list, as concatenate takes them
        lambda: np.concatenate([device, host]),  # numpy functions dispatch to the device's
        lambda: xp.where(device > 0, host, 0.0),
        lambda: device + host,
        lambda: host * device,
        lambda: device @ host.T,
        lambda: device + np.asarray(1.0),  # a 0-d host array is not a scalar to CuPy
        lambda: xp.ascontiguousarray(host),
        lambda: range(device.sum().astype(np.int64)),  # no __index__
    ]
    for call in refused:
        with pytest.raises(TypeError):
            call()
    with pytest.raises(ValueError, match="fill"):
        device[0] = host[0]  # a basic index takes device values and scalars only
    with refusing_implicit_copies(), pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(device)


def test_what_cupy_accepts_is_accepted() -> None:
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    device = xp.asarray(host)  # the host -> device copy
    assert isinstance(device, DeviceArray) and array_module(device) is xp
    assert isinstance(xp.asarray([1, 2]), DeviceArray) and isinstance(
        xp.zeros_like(host), DeviceArray
    )
    total = device.sum() * np.float32(2) + 1  # numpy and Python scalars; a 0-d device result
    assert isinstance(total, DeviceArray) and total.ndim == 0 and int(total) == 31
    assert isinstance(np.concatenate([device, device]), DeviceArray)
    assert (device > np.asarray(1.0)).sum() == 4  # comparisons read a 0-d host operand
    picked = device[np.array([1, 0])]  # host indices are copied to the device
    assert isinstance(picked, DeviceArray)
    device[np.array([0])] = host[1:]  # an advanced index's assignment takes host values
    device[1] = device[0]
    device[1, 0] = 7.0
    with refusing_implicit_copies():
        back = to_numpy(device)
    assert type(back) is np.ndarray
    np.testing.assert_array_equal(back, [[3, 4, 5], [7, 4, 5]])


# -------------------------------------------------------------------------------- models
def lanes_logits(model: Any, ids: np.ndarray, prompts: tuple[int, int]) -> list[np.ndarray]:
    """Every row's logits (host) of two lanes: prompts of ``prompts`` tokens of ``ids`` rows 0
    and 1 prefilled in chunks of 7, then a three-row step of both lanes, then decode steps."""
    runner = ModelRunner(model)
    pool = runner.new_pool(lanes=2, max_context=96, step_rows=4, page_tokens=16)
    states = [pool.open(96), pool.open(96)]
    out = [
        to_numpy(runner.prefill(ids[i, :n], states[i], chunk=7).logits[0])
        for i, n in enumerate(prompts)
    ]
    at = list(prompts)
    for rows in (3,) + (1,) * DECODE_STEPS:
        step = runner.forward([ids[i, at[i] : at[i] + rows] for i in range(2)], states)
        out += [to_numpy(logits) for logits in step.logits]
        at = [a + rows for a in at]
    return out


def assert_strict_equals_cpu(artifact: Path, prompts: tuple[int, int], **options: Any) -> None:
    cpu = load_model(artifact, options=options or None)
    ids = np.random.default_rng(sum(prompts)).integers(0, cpu.config.vocab, (2, 96))
    reference = lanes_logits(cpu, ids, prompts)
    with strict_cuda() as backend:
        ours = lanes_logits(load_model(artifact, backend, options=options or None), ids, prompts)
    for got, want in zip(ours, reference, strict=True):
        assert type(got) is np.ndarray
        np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_TOL * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_qwen3_5(artifact_path: Callable[[str, str], Path], kind: str) -> None:
    assert_strict_equals_cpu(artifact_path("qwen3_5_bf16", kind), (19, 6))


@pytest.fixture(scope="module")
def qwen4_exp_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = pytest.importorskip("tests.tiny_qwen4_exp")
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("strict_qwen4_exp")
    checkpoint = tiny.build(root / "ple", indexer_n_heads=16)
    convert("qwen4_exp_bf16", {"base": str(checkpoint)}, root / "ple.ninfer")
    return root / "ple.ninfer"


@pytest.mark.parametrize("ple_rows", ["resident", "streamed"])
def test_qwen4_exp(
    qwen4_exp_artifact: Path, ple_rows: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past QSA's budget (16 tokens) in one lane, under it in the other."""
    monkeypatch.setattr(qwen4_exp_model, "SERVED_BACKENDS", ("cpu", "cuda"))
    assert_strict_equals_cpu(qwen4_exp_artifact, (37, 9), ple_rows=ple_rows)


@pytest.fixture(scope="module")
def glm5_next_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = pytest.importorskip("tests.tiny_glm5_next")
    root = tmp_path_factory.mktemp("strict_glm5_next")
    checkpoint = tiny.build_tiny_glm5_next(root / "checkpoint", index_n_heads=16)
    tiny.convert("glm5_next_bf16", checkpoint, root / "tiny.ninfer")
    return root / "tiny.ninfer"


def test_glm5_next(glm5_next_artifact: Path) -> None:
    """Past the DSA indexer's index_topk (8 tokens) in one lane, under it in the other."""
    assert_strict_equals_cpu(glm5_next_artifact, (37, 6))
