"""The CUDA paths' host/device discipline, checked on the CPU (``tests/strict_device.py``,
``tests/strict_cuda.py``): the harness refuses what CuPy refuses, and Qwen3.5 (dense and MoE),
Qwen4Exp and GLM5Next run on the strict backend (the CPU backend under the ``cuda`` name, its
arrays refusing host arrays as CuPy's do) and give the CPU backend's logits.

Each model runs two lanes of one pool through ``ModelRunner``: prompts prefilled in chunks (one
longer than the attention budget where the model has one: QSA's, the DSA indexer's), a
three-row step of both lanes (a compiled step) and decode steps of both; every row's logits
equal the CPU's bit for bit (the same numpy math, on views of the same memory). Then the
engine (its backend registered as ``cuda`` for the test): two prompts sharing a system prompt,
served one after the other with the prefix cache (the second resumes from the first's
checkpoints), sampled with log-probabilities, then a prompt with two images (Qwen3.5's, Qwen4Exp's
and GLM5Next's towers), and Qwen3.5 with MTP drafts: the CPU engine's tokens and
log-probabilities; under preemption (a lane's memory saved to the host and restored), the
greedy tokens of a pool large enough for every lane; with expert offload (experts streamed
under a ``--vram-budget``), the CPU engine's under the same budget."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.arrays import array_module
from ninfer_runtime.backends.base import to_numpy
from ninfer_runtime.engine import Engine, Finished, GenerationRequest, TokenEvent
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.models import load_model, vision_families
from ninfer_runtime.ops.registry import resolve
from ninfer_runtime.runner import ModelRunner
from ninfer_runtime.speculative import SpecConfig
from tests.runtime.offload_runs import budget_shares
from tests.runtime.test_engine_images import png
from tests.runtime.test_engine_images import request as image_request
from tests.runtime.test_glm5_next_images import converted  # noqa: F401
from tests.runtime.test_prefix_cache import _capacity, _concurrent
from tests.strict_cuda import strict_cuda
from tests.strict_device import DeviceArray, capturing, refusing_implicit_copies, xp

#: decode steps after the three-row step
DECODE_STEPS = 3


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
        lambda: device.dot(host.T),
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


def test_a_capture_refuses_copies_from_the_host_reads_back_and_waits() -> None:
    device = xp.ones((2, 3), dtype=np.float32)
    refused: list[Callable[[], Any]] = [
        lambda: xp.asarray(np.ones(3)),
        lambda: xp.asarray(5),
        lambda: device.get(),
        lambda: device.sum().item(),
        lambda: device.tolist(),
        lambda: int(device.sum()),
        lambda: bool(device.any()),
        lambda: xp.argsort(device, axis=-1),  # CuPy's sort waits for the device
        lambda: np.argsort(device, axis=-1),
        lambda: xp.unique(device),
        lambda: device.nonzero(),
    ]
    with capturing():
        for call in refused:
            with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
                call()
        assert isinstance(xp.asarray(device) * 2 + device.sum(), DeviceArray)  # device work
    assert device.get().sum() == 6  # outside the capture, reads are fine again


def test_what_cupy_accepts_is_accepted() -> None:
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    device = xp.asarray(host)  # the host -> device copy
    assert isinstance(device, DeviceArray) and array_module(device) is xp
    assert isinstance(xp.asarray([1, 2]), DeviceArray)
    assert isinstance(xp.zeros_like(host), DeviceArray)  # reads the host array's shape
    ends = np.cumsum([1, 1])  # split points and take's indices are read on the host
    assert all(isinstance(part, DeviceArray) for part in xp.split(device, ends, axis=-1))
    assert isinstance(xp.take(device, np.array([0])), DeviceArray)
    assert isinstance(device.nonzero()[0], DeviceArray)  # numpy's own method returns host
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


def test_kernel_ops_refuse_host_arguments() -> None:
    """An op the CUDA backend serves with a kernel refuses a host array where its reference
    would have taken it; outside the harness the op is the reference again."""
    x, weight = np.ones((2, 4), dtype=np.float32), np.ones(4, dtype=np.float32)
    with strict_cuda():
        rms_norm = resolve("norm", "rms_norm", device="cuda")
        with pytest.raises(TypeError, match=r"kernel norm\.rms_norm"):
            rms_norm(xp.asarray(x), weight, 1e-6, 0.0)
        assert isinstance(rms_norm(xp.asarray(x), xp.asarray(weight), 1e-6, 0.0), DeviceArray)
    assert type(resolve("norm", "rms_norm", device="cuda")(x, weight, 1e-6, 0.0)) is np.ndarray


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
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_qwen3_5(artifact_path: Callable[[str, str], Path], kind: str) -> None:
    assert_strict_equals_cpu(artifact_path("qwen3_5_bf16", kind), (19, 6))


def test_qwen3_5_engine_with_mtp_drafts(artifact_path: Callable[[str, str], Path]) -> None:
    spec = SpecConfig(draft_tokens=2, proposal_head="full")
    assert_engine_equals_cpu(artifact_path("qwen3_5_bf16", "moe"), spec=spec)


def test_qwen3_5_engine_with_images(tmp_path_factory: pytest.TempPathFactory) -> None:
    from ninfer_convert.pipeline import convert
    from tests.runtime.tiny_vlm import write_tiny_vlm

    root = tmp_path_factory.mktemp("strict_vlm")
    convert("qwen3_5_bf16", {"base": str(write_tiny_vlm(root))}, root / "vlm.ninfer")
    assert_engine_equals_cpu(root / "vlm.ninfer", images=True)


@pytest.fixture(scope="module")
def qwen4_exp_artifact(qwen4_exp_ple: Path) -> Path:
    return qwen4_exp_ple


@pytest.mark.parametrize("prompts", [(37, 9), (5, 9)], ids=["past_budget", "within_budget"])
@pytest.mark.parametrize("ple_rows", ["resident", "streamed"])
def test_qwen4_exp(qwen4_exp_artifact: Path, ple_rows: str, prompts: tuple[int, int]) -> None:
    """Past QSA's budget (16 tokens) in one lane, under it in the other (its decode steps
    read the token bucket past the furthest position); or both lanes under it. With resident
    n-gram tables the decode steps are captured either way: from their second call on
    nothing is copied in or read back."""
    assert_strict_equals_cpu(qwen4_exp_artifact, prompts, ple_rows=ple_rows)


def test_qwen4_exp_engine_with_images(tmp_path_factory: pytest.TempPathFactory) -> None:
    tiny = pytest.importorskip("tests.tiny_qwen4_exp")
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("strict_qwen4_exp_vlm")
    checkpoint = tiny.build(root / "vlm", multimodal=True, mtp=False, indexer_n_heads=16)
    convert("qwen4_exp_bf16", {"base": str(checkpoint)}, root / "vlm.ninfer")
    assert_engine_equals_cpu(root / "vlm.ninfer", images=True)


@pytest.fixture(scope="module")
def glm5_next_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = pytest.importorskip("tests.tiny_glm5_next")
    root = tmp_path_factory.mktemp("strict_glm5_next")
    checkpoint = tiny.build_tiny_glm5_next(root / "checkpoint", index_n_heads=16)
    tiny.convert("glm5_next_bf16", checkpoint, root / "tiny.ninfer")
    return root / "tiny.ninfer"


@pytest.mark.parametrize("ranked", [None, 1000, 500], ids=["ranked", "row_by_row", "sorted"])
def test_glm5_next(
    glm5_next_artifact: Path, monkeypatch: pytest.MonkeyPatch, ranked: int | None
) -> None:
    """Past the DSA indexer's index_topk (8 tokens) in one lane, under it in the other; its
    steps (24 pools a row: 576 comparisons to rank them) captured with the pools ranked a
    step's rows at once, a row at a time (``RANKED_TOP_K`` 1000: ``top_k_ids`` ranks a
    share of the rows a call), or run eagerly (500: a row's ranking does not fit, so the
    indexer sorts, which a capture refuses)."""
    from ninfer_runtime import functional

    if ranked is not None:
        monkeypatch.setattr(functional, "RANKED_TOP_K", ranked)
    assert_strict_equals_cpu(glm5_next_artifact, (37, 6))


# -------------------------------------------------------------------------------- engine
#: sampled, every token scored (the sampler and the log-probabilities on the device's rows)
SAMPLED = {"temperature": 0.8, "seed": 3, "top_k": 20, "logprobs": 2, "max_tokens": 8}


def served(engine: Engine, requests: list[GenerationRequest]) -> list[list[Any]]:
    """Each request's (token, log-probability) pairs and its cached prompt tokens, served one
    after the other."""
    out: list[list[Any]] = []
    for r in requests:
        events = list(engine.generate(r))
        out.append([(e.token_id, e.logprob) for e in events if isinstance(e, TokenEvent)])
        out[-1] += [e.usage.cached_tokens for e in events if isinstance(e, Finished)]
    return out


def assert_engine_equals_cpu(artifact: Path, *, images: bool = False, **options: Any) -> None:
    rng = np.random.default_rng(5)
    system = rng.integers(0, 400, 40).tolist()
    params = SamplingParams(**SAMPLED, ignore_eos=True)
    requests = [
        GenerationRequest(prompt_ids=system + rng.integers(0, 400, n).tolist(), sampling=params)
        for n in (3, 20)
    ]
    if images:
        requests.append(
            image_request("Look:", png(24, 16, 1), "and", png(16, 40, 2), sampling=params)
        )
    options = dict(max_lanes=2, max_context=128, prefill_chunk=16, prefix_cache=True,
                   checkpoint_interval=16, **options)  # fmt: skip
    reference = served(Engine(artifact, **options), requests)
    with strict_cuda() as backend:
        engine = Engine(artifact, backend="cuda", **options)
        assert engine.model.backend is backend
        assert served(engine, requests) == reference
    assert reference[1][-1] > 0  # the second prompt resumed from the first's checkpoints


def test_glm5_next_engine_with_images(
    converted: tuple[Path, Path],  # noqa: F811  # test_glm5_next_images.py's fixture
) -> None:
    """GLM5Next's image path too, on the artifact with a tower that ``test_glm5_next_images.py``
    builds."""
    assert "cuda" in vision_families.GLM5_NEXT.backends
    assert_engine_equals_cpu(converted[1], images=True)


MOE_MODELS = ["qwen3_5_moe", "qwen4_exp", "glm5_next"]


def moe_artifact(model: str, request: pytest.FixtureRequest) -> Path:
    if model == "qwen3_5_moe":
        return request.getfixturevalue("artifact_path")("qwen3_5_bf16", "moe")
    return request.getfixturevalue(f"{model}_artifact")


@pytest.mark.parametrize("model", MOE_MODELS)
def test_preemption_saves_and_restores_on_the_device(
    model: str, request: pytest.FixtureRequest
) -> None:
    """Three lanes that each outgrow one 256-token page in a pool of four: a lane is paused
    (its pages and slot states copied to the host) and restored, and every lane streams the
    roomy CPU engine's greedy tokens."""
    artifact = moe_artifact(model, request)
    rng = np.random.default_rng(0)
    lanes = [rng.integers(0, 400, 220 + 10 * i).tolist() for i in range(3)]
    params = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0.0)
    roomy = Engine(artifact, max_lanes=3, max_context=512)
    with strict_cuda():
        small = Engine(artifact, backend="cuda", max_lanes=3, max_context=512,
                       context_capacity=_capacity(roomy.pool, 4))  # fmt: skip
        assert _concurrent(small, lanes, params) == _concurrent(roomy, lanes, params)
    assert small.preemptions > 0


@pytest.mark.parametrize("model", MOE_MODELS)
@pytest.mark.parametrize("host_cache", [None, "1MiB"], ids=["from_disk", "host_cache"])
def test_expert_offload_on_the_device(
    model: str,
    host_cache: str | None,
    request: pytest.FixtureRequest,
) -> None:
    """Half the routed experts resident under a ``--vram-budget``, the rest streamed (from the
    artifact, or a host cache): the CPU engine's greedy tokens under the same budget."""
    artifact = moe_artifact(model, request)
    floor, experts = budget_shares(artifact)
    options = dict(max_context=64, max_lanes=1, prefill_chunk=8,
                   vram_budget=floor + experts // 2, host_expert_cache=host_cache)  # fmt: skip
    prompt = np.random.default_rng(0).integers(0, 400, 30).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    requests = [GenerationRequest(prompt_ids=prompt, sampling=params)]
    reference = served(Engine(artifact, **options), requests)
    with strict_cuda():
        engine = Engine(artifact, backend="cuda", **options)
        assert engine.expert_offload is not None
        assert 0 < engine.expert_offload.plan.resident_fraction < 1
        assert served(engine, requests) == reference
