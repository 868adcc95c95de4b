"""The moe family's ``routed_experts`` on our expert GEMVs (``nvrtc``: a table of the layer's
experts, no read back) against the reference's loop (an expert's products at a time), on the
sparse layers of the tiny GLM5Next artifact (bf16 experts, a clamped SwiGLU) on CUDA: 1, 3 and
8 rows within the family's stated ``nvrtc`` tolerance; with every other expert held in host
memory (None: its pairs add nothing, as the reference skips them); a table serves only the
experts it was built from; and the whole model's decode on the policy's providers (ours, for
the routed experts and for the connections' Sinkhorn) gives logits within that tolerance of
the same decode with the ``reference`` forced."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.models import load_model
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.moe import reference
from ninfer_runtime.ops.moe.reference import TOLERANCE
from ninfer_runtime.runner import ModelRunner

from .conftest import requires_gpu
from .test_glm5_next_cuda import VOCAB, glm5_next_artifact  # noqa: F401  (the fixture)

pytestmark = requires_gpu


def _cuda_model(artifact: Path):  # type: ignore[no-untyped-def]
    from ninfer_runtime.backends import get_backend

    return load_model(Artifact.open(artifact), get_backend("cuda"))


def _blocks(model):  # type: ignore[no-untyped-def]
    from ninfer_runtime.models.glm5_next.ffn import GroupedMoe

    blocks = [layer.ffn for layer in model.layers if isinstance(layer.ffn, GroupedMoe)]
    assert blocks, "the tiny GLM5Next has sparse layers"
    return blocks


def _ours():  # type: ignore[no-untyped-def]
    """The moe family's nvrtc module (it imports CuPy: loaded only where the GPU tests run)."""
    return importlib.import_module("ninfer_runtime.ops.moe.nvrtc")


def _both(block, x, experts):  # type: ignore[no-untyped-def]
    """(reference, nvrtc) routed shares of rows x through ``experts``."""
    import cupy as cp

    top, weights = block.route(x)
    outs = []
    for provider in (reference, _ours()):
        out = cp.zeros_like(x)
        provider.routed_experts(block.backend, x, top, weights, experts, out=out)
        outs.append(cp.asnumpy(out))
    return outs


def _close(got: np.ndarray, want: np.ndarray) -> None:
    rtol, atol = TOLERANCE["nvrtc"]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * float(np.abs(want).max()))


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_routed_experts_on_the_expert_gemvs_match_the_reference(
    glm5_next_artifact: Path,  # noqa: F811
    rows: int,
) -> None:
    import cupy as cp

    model = _cuda_model(glm5_next_artifact)
    rng = np.random.default_rng(rows)
    for block in _blocks(model):
        hidden = block.router.shape[1]
        x = cp.asarray(rng.standard_normal((rows, hidden)), dtype=cp.float32)
        want, got = _both(block, x, block.experts)
        assert np.abs(want).max() > 0
        _close(got, want)
        # every other expert in host memory: its pairs add nothing on either path
        held = [ex if e % 2 else None for e, ex in enumerate(block.experts)]
        want, got = _both(block, x, held)
        _close(got, want)


def test_a_table_serves_only_its_experts(glm5_next_artifact: Path) -> None:  # noqa: F811
    model = _cuda_model(glm5_next_artifact)
    block = _blocks(model)[0]
    experts, nvrtc = list(block.experts), _ours()
    first = nvrtc._routed_table(block.backend, experts)
    assert first is not None and first.serves(experts)
    assert nvrtc._routed_table(block.backend, experts) is first
    experts[0] = None  # the same list, an expert gone to host memory
    second = nvrtc._routed_table(block.backend, experts)
    assert second is not first and second.serves(experts) and not first.serves(experts)


@pytest.mark.parametrize("forced", [("moe", "routed_experts"), ("norm", "sinkhorn")])
def test_decode_on_ours_gives_the_references_logits(
    glm5_next_artifact: Path,  # noqa: F811
    forced: tuple[str, str],
) -> None:
    """Six decode steps of the policy's greedy tokens, with the op on the policy's provider
    (ours: the routed experts on the expert GEMVs; the connections' Sinkhorn in one launch)
    and with the ``reference`` forced: every step's logits within the moe family's ``nvrtc``
    tolerance (the same tokens fed to both, so a near-tie cannot part them)."""
    family, op = forced
    policy = importlib.import_module(f"ninfer_runtime.ops.{family}.policy")
    assert policy.choose(op, device="cuda")[0] == "nvrtc"  # the policy's choice is ours
    ids = np.random.default_rng(5).integers(0, VOCAB, 12)
    tokens: list[int] = []
    runs = {}
    for on_reference in (False, True):
        runner = ModelRunner(_cuda_model(glm5_next_artifact))
        state = runner.new_state(64)
        logits = [_host(runner.prefill(ids, state).logits[0])[-1]]
        forced_reference = registry.override(family, op, "reference")
        with forced_reference if on_reference else contextlib.nullcontext():
            for step in range(6):
                if not on_reference:
                    tokens.append(int(np.argmax(logits[-1])))
                out = runner.forward([np.array([tokens[step]])], [state]).logits[0]
                logits.append(_host(out)[-1])
        runs[on_reference] = logits
    for ours, want in zip(runs[False], runs[True], strict=True):
        _close(ours, want)


def _host(a):  # type: ignore[no-untyped-def]
    import cupy as cp

    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else a
