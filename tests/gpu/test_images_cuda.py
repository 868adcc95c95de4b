"""Images on the CUDA backend against the CPU backend, on the tiny random Qwen3.5 VLMs (dense
and MoE) that the CPU image tests build (tests/runtime/tiny_vlm.py, converted with the bf16
recipes).

* The vision tower: the same images encoded by a CPU and a CUDA ``VisionTower`` on the same
  artifact, within a bound of the CPU rows' largest magnitude. With float32 prefill products
  (the tower's attention is then the reference on CuPy: ``sdpa`` declines float32) the
  differences are the small-M tensor-core products' (x carried as two bf16 halves, ~1e-5 of
  each product) compounding through about ten products and two softmaxes: ``FLOAT32_TOL``
  leaves a decade over that, while a wrong op (a mask, a bias, a rotation) shows at 1e-1 or
  more. With the default bf16 products (x rounded to bf16, unit roundoff 2^-9, in every
  product past the small-M kernels' 64 rows; q, k, v and the attention probabilities rounded
  to bf16 by ``sdpa``) the bound is ``BF16_TOL``: the same rounding emulated on the CPU (x
  through bf16 past 64 rows, torch's CPU attention on bf16 q, k, v) gave 3.1e-3, 3.7e-3 and
  5.6e-3 for the dense VLM's one, two and large images, so 2e-2 is about 4x that. The large
  image's 256 patches take the bf16 prefill GEMMs; the small ones stay on the small-M kernels.
* The attention family's ``segment`` op: every CUDA provider against the float64 reference,
  within its stated tolerance (``segment_reference.TOLERANCE``).
* The engine: greedy image chats (one image, two images, then the next turn of the chat,
  which decodes after the image at the positions shifted by ``rope_delta`` and, with the
  prefix cache, resumes from a checkpoint past the image) give the CPU engine's tokens, token
  for token, with float32 prefill products (as ``test_backend.py``'s engine test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends import get_backend
from ninfer_runtime.engine import Engine, GenerationRequest
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.frontend.vision import ImageProcessor, decode_image
from ninfer_runtime.models.qwen3_5.vision import VisionTower
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.attention import policy
from ninfer_runtime.ops.attention.segment_reference import TOLERANCE, segment
from tests.runtime.test_engine_images import CAT, TOWER, chat, png, run
from tests.runtime.test_engine_images_moe import EXPERTS
from tests.runtime.tiny_vlm import PROCESSOR, write_tiny_vlm

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

#: tower rows, CUDA vs CPU, as a fraction of the CPU rows' largest magnitude (see above)
FLOAT32_TOL, BF16_TOL = 1e-3, 2e-2
RECIPES = {"dense": "qwen3_5_bf16", "moe": "qwen3_5_moe_bf16"}
#: 64×64 pixels (the processor's 4096-pixel cap): 8×8 merged tokens, 256 patches, past the
#: small-M kernels' rows
LARGE = png(64, 64, 4)
IMAGES = {"one": [CAT], "two": [TOWER, CAT], "large": [LARGE]}
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def host(a: Any) -> np.ndarray:
    import cupy as cp

    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)


@pytest.fixture(scope="module")
def vlm_artifact(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``vlm_artifact(kind)``: the tiny VLM of ``kind`` (dense, moe), converted on first use."""
    import torch

    from ninfer_convert.pipeline import convert

    torch.set_num_threads(4)
    root = tmp_path_factory.mktemp("gpu_vlm")
    done: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in done:
            checkpoint = root / f"{kind}-checkpoint"
            checkpoint.mkdir()
            write_tiny_vlm(checkpoint, experts=EXPERTS if kind == "moe" else None)
            done[kind] = root / f"{kind}.ninfer"
            convert(RECIPES[kind], {"base": str(checkpoint)}, done[kind])
        return done[kind]

    return get


# ------------------------------------------------------------------------------ the tower
@pytest.mark.parametrize("precision", ["float32", "bf16"])
@pytest.mark.parametrize("images", sorted(IMAGES))
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_tower_rows_match_the_cpu_tower(
    kind: str, images: str, precision: str, vlm_artifact: Any
) -> None:
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    path = vlm_artifact(kind)
    processor = ImageProcessor.from_config(PROCESSOR)
    pixels, grid = processor.process([decode_image(data) for data in IMAGES[images]])
    cpu = VisionTower(Artifact.open(path), get_backend("cpu"))
    cuda = VisionTower(
        Artifact.open(path),
        CudaBackend(
            prefill_precision=precision,
            decode_precision="split" if precision == "float32" else "bf16",
        ),
    )
    want = cpu.encode(pixels, grid)
    got = host(cuda.encode(pixels, grid))
    assert got.shape == want.shape == (sum(cpu.merged_tokens(grid)), cpu.config.out_hidden)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    REPORT.append((f"{kind}/{images}-{precision}", "tower rows max|Δ| (rel)", f"{err / scale:.1e}"))
    tol = FLOAT32_TOL if precision == "float32" else BF16_TOL
    assert err <= tol * scale, f"max|Δ| {err:.3e} of max|row| {scale:.3e}"


# --------------------------------------------------------------------- the segment op
#: (rows, segment bounds, heads, head size): Qwen3.5's tower heads (16 of 72) over two images
#: of unequal size, and the tiny tower's (4 of 16) over one large frame
SEGMENT_CASES = [
    (700, (0, 196, 700), 16, 72),
    (1024, (0, 1024), 4, 16),
]
#: the library providers (the reference on CuPy is what the float32 tower test runs)
PROVIDERS = [n for n in policy.TABLE[("segment", "cuda")] if n != "reference"]


@pytest.mark.parametrize(("rows", "bounds", "heads", "d"), SEGMENT_CASES)
@pytest.mark.parametrize("name", PROVIDERS)
def test_segment_provider_matches_the_reference(
    name: str, rows: int, bounds: tuple[int, ...], heads: int, d: int
) -> None:
    import cupy as cp

    provider = registry.providers("attention")["segment"][name]
    if not provider.available():
        pytest.skip(f"attention.{name} needs {', '.join(provider.requires)} (not installed)")
    key = {"device": "cuda", "precision": "bf16", "head_dim": d}
    assert provider.takes(key), f"attention.{name} declines {key}"
    rng = np.random.default_rng(rows)
    q, k, v = (rng.standard_normal((rows, heads, d)).astype(np.float32) for _ in range(3))
    want = segment(*(a.astype(np.float64) for a in (q, k, v)), bounds, d**-0.5)
    got = provider.load()(cp.asarray(q), cp.asarray(k), cp.asarray(v), bounds, d**-0.5)
    assert isinstance(got, cp.ndarray) and got.dtype == cp.float32 and got.shape == q.shape
    rtol, atol = TOLERANCE[name]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(host(got), want, rtol=rtol, atol=atol * scale)


def test_the_tower_resolves_sdpa_for_bf16_and_the_reference_for_float32() -> None:
    from ninfer_runtime.ops.attention import segment_reference, segment_sdpa

    bf16 = registry.resolve("attention", "segment", device="cuda", precision="bf16", head_dim=72)
    exact = registry.resolve(
        "attention", "segment", device="cuda", precision="float32", head_dim=72
    )
    if registry.providers("attention")["segment"]["sdpa"].available():
        assert bf16 is segment_sdpa.segment
    assert exact is segment_reference.segment


# ------------------------------------------------------------------------------ the engine
def tokens(engine: Engine, messages: list[dict[str, Any]], images: list[Any]) -> list[int]:
    return run(engine, GenerationRequest(messages=messages, images=images, sampling=GREEDY))[0]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_image_chat_greedy_tokens_equal_the_cpu_engine(
    kind: str, vlm_artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NINFER_CUDA_PREFILL", "float32")  # token-for-token comparable
    monkeypatch.setenv("NINFER_CUDA_DECODE", "split")
    path = vlm_artifact(kind)
    engines = {
        "cpu": Engine(path, max_lanes=2, max_context=256, prefix_cache=True),
        "cuda": Engine(
            path,
            backend="cuda",
            max_lanes=2,
            max_context=256,
            prefix_cache=True,
            kv_dtype="float32",
        ),
    }
    assert engines["cuda"].vision is not None  # the cuda backend takes images
    one = chat("What is this?", CAT)
    two = chat(TOWER, "and", CAT, "compare them.")
    got: dict[str, list[list[int]]] = {}
    for name, engine in engines.items():
        first = tokens(engine, *one)
        reply = engine.tokenizer.decode(first, skip_special_tokens=True)
        later = [*one[0], {"role": "assistant", "content": reply},
                 {"role": "user", "content": "And its colour?"}]  # fmt: skip
        # the second turn resumes from the first's checkpoint (past the image) and decodes
        # at positions shifted by the image's rope_delta
        got[name] = [first, tokens(engine, *two), tokens(engine, later, one[1])]
        assert engine.media_cache.stats.hits >= 1  # the resent picture was not re-encoded
    REPORT.append(
        (f"{kind}/image chat", "greedy tokens cuda == cpu", str(got["cuda"] == got["cpu"]))
    )
    assert got["cuda"] == got["cpu"]
