"""The vision tower's CPU reference (``ninfer_runtime.models.qwen3_5.vision``) against
transformers' ``Qwen3_5VisionModel`` on a tiny random Qwen3.5 VLM.

The reference runs in float32 on exactly the weights the artifact holds: the checkpoint rounded
through bf16 for the bf16 recipe, the artifact's decoded values (put under HF's names by a map
written out here, independently of the converter's) for a quantized recipe. What remains is the
tower's math, so the tolerance is tight: max |Δ| within 1e-4 of max |reference| (mistakes in
the rotary layout, the position resampling or the merge order cost 1e-2 and more).

The grids exercise the position table (side 4) resampled up and down, two images of different
sizes in one call, and a two-frame video (each frame its own attention segment).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends import get_backend
from ninfer_runtime.errors import ModelError
from ninfer_runtime.models.qwen3_5.vision import VisionConfig, VisionTower
from ninfer_runtime.models.qwen3_5.vision_ops import erfc, gelu_erf, gelu_tanh
from tests.tiny_checkpoints import COMMON

TOL = 1e-4
VISION = dict(
    depth=2,
    hidden_size=64,
    intermediate_size=80,
    num_heads=4,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
    out_hidden_size=COMMON["hidden_size"],
)
PATCH_WIDTH = 3 * 2 * 4 * 4
ONE_IMAGE = [[1, 4, 6]]
TWO_IMAGES = [[1, 4, 6], [1, 8, 4]]
VIDEO_AND_SMALL_IMAGE = [[2, 4, 4], [1, 2, 2]]


def randomize_vision(visual: Any, gain: float = 1.5) -> None:
    """Draws that keep activations near unit scale and make attention far from uniform."""
    import torch

    with torch.no_grad():
        for name, p in visual.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.3)
                if name.endswith("weight"):
                    p.add_(1.0)
            elif name.startswith("pos_embed"):
                p.normal_()
            elif p.ndim == 1:
                p.normal_(0, 0.3)
            else:
                p.normal_(0, gain / math.sqrt(p[0].numel()))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> Path:
    """A tiny VLM (random vision tower, default-initialised text) in HF's layout."""
    import torch
    import transformers as t

    torch.manual_seed(0)
    text = t.Qwen3_5TextConfig(intermediate_size=256, **COMMON)
    config = t.Qwen3_5Config(
        text_config=text.to_dict(), vision_config=t.Qwen3_5VisionConfig(**VISION)
    )
    model = t.Qwen3_5ForConditionalGeneration(config)
    randomize_vision(model.model.visual)
    directory = tmp_path_factory.mktemp("tiny_vlm_tower")
    model.eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> dict[str, Path]:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("vision_tower_art")
    paths = {}
    for recipe in ("qwen3_5_bf16", "qwen3_6_27b"):
        paths[recipe] = out / f"{recipe}.ninfer"
        convert(recipe, {"base": str(checkpoint)}, paths[recipe])
    return paths


@pytest.fixture(scope="module")
def tower(artifacts: dict[str, Path]) -> VisionTower:
    with Artifact.open(artifacts["qwen3_5_bf16"]) as art:
        return VisionTower(art, get_backend("cpu"))


def hf_visual(checkpoint: Path) -> Any:
    from transformers import Qwen3_5ForConditionalGeneration

    model = Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint, dtype="float32")
    return model.eval().model.visual


@pytest.fixture(scope="module")
def hf_bf16(checkpoint: Path) -> Any:
    """transformers' tower in float32 on the checkpoint rounded through bf16 (what the bf16
    recipe stores for every vision parameter)."""
    import torch

    visual = hf_visual(checkpoint)
    with torch.no_grad():
        for p in visual.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return visual


def with_artifact_weights(visual: Any, art: Artifact) -> Any:
    """``visual`` with every parameter replaced by the artifact's decoded values: query, key
    and value stack into ``qkv``, the patch embedding is the Conv3d kernel read flat."""
    import torch

    params = dict(visual.named_parameters())
    written: set[str] = set()

    def put(hf_name: str, *names: str) -> None:
        value = np.concatenate([art.parameter(n, in_order=True) for n in names])
        with torch.no_grad():
            params[hf_name].copy_(torch.from_numpy(value).reshape(params[hf_name].shape))
        written.add(hf_name)

    def pair(hf: str, name: str) -> None:
        put(hf + ".weight", name)
        put(hf + ".bias", name + "_bias")

    pair("patch_embed.proj", "vision/patch_embedding")
    put("pos_embed.weight", "vision/position_embedding")
    for i in range(VISION["depth"]):
        b, v = f"blocks.{i}.", f"vision/layers/{i}/"
        for norm in ("norm1", "norm2"):
            put(f"{b}{norm}.weight", f"{v}{norm}_weight")
            put(f"{b}{norm}.bias", f"{v}{norm}_bias")
        qkv = [f"{v}attention/{s}" for s in ("query", "key", "value")]
        put(b + "attn.qkv.weight", *qkv)
        put(b + "attn.qkv.bias", *(n + "_bias" for n in qkv))
        pair(b + "attn.proj", v + "attention/output")
        pair(b + "mlp.linear_fc1", v + "mlp/fc1")
        pair(b + "mlp.linear_fc2", v + "mlp/fc2")
    put("merger.norm.weight", "vision/merger/norm_weight")
    put("merger.norm.bias", "vision/merger/norm_bias")
    pair("merger.linear_fc1", "vision/merger/fc1")
    pair("merger.linear_fc2", "vision/merger/fc2")
    assert written == set(params)
    return visual


def pixels(grid: list[list[int]], seed: int = 0) -> np.ndarray:
    patches = sum(t * h * w for t, h, w in grid)
    return np.random.default_rng(seed).standard_normal((patches, PATCH_WIDTH)).astype(np.float32)


def reference(visual: Any, pixel_values: np.ndarray, grid: list[list[int]]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = visual(torch.from_numpy(pixel_values), grid_thw=torch.tensor(grid))
    return out.pooler_output.numpy()


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


# ---------------------------------------------------------------------------- parity
@pytest.mark.parametrize(
    "grid", [ONE_IMAGE, TWO_IMAGES, VIDEO_AND_SMALL_IMAGE], ids=["one", "two", "video"]
)
def test_tower_matches_transformers(tower, hf_bf16, grid) -> None:
    x = pixels(grid)
    ref = reference(hf_bf16, x, grid)
    got = tower.encode(x, np.array(grid))
    assert got.dtype == np.float32
    assert got.shape == (sum(t * h * w for t, h, w in grid) // 4, COMMON["hidden_size"])
    assert relative_error(got, ref) < TOL


def test_images_in_one_call_do_not_see_each_other(tower) -> None:
    x = pixels(TWO_IMAGES, seed=1)
    together = tower.encode(x, np.array(TWO_IMAGES))
    assert tower.merged_tokens(np.array(TWO_IMAGES)) == [6, 8]
    apart = np.concatenate(
        [
            tower.encode(x[:24], np.array(TWO_IMAGES[:1])),
            tower.encode(x[24:], np.array(TWO_IMAGES[1:])),
        ]
    )
    assert relative_error(together, apart) < 1e-6


def test_quantized_tower_matches_transformers_on_its_decoded_weights(artifacts, checkpoint) -> None:
    with Artifact.open(artifacts["qwen3_6_27b"]) as art:
        fc1 = art.objects[art.bindings["vision/layers/0/mlp/fc1"].object]
        assert fc1.format == "q4_g64_fp16"  # a decoded product, not bf16
        tower = VisionTower(art, get_backend("cpu"))
        visual = with_artifact_weights(hf_visual(checkpoint), art)
    x = pixels(TWO_IMAGES, seed=2)
    got = tower.encode(x, np.array(TWO_IMAGES))
    assert relative_error(got, reference(visual, x, TWO_IMAGES)) < TOL


# ---------------------------------------------------------------------------- config
def test_config_comes_from_the_vision_component(tower) -> None:
    c = tower.config
    assert (c.depth, c.hidden, c.intermediate, c.heads, c.head_dim) == (2, 64, 80, 4, 16)
    assert (c.patch, c.temporal_patch, c.merge, c.position_side) == (4, 2, 2, 4)
    assert (c.out_hidden, c.channels, c.patch_width) == (COMMON["hidden_size"], 3, PATCH_WIDTH)
    assert (c.activation, c.rope_theta) == ("gelu_pytorch_tanh", 10000.0)


def test_config_defaults_and_refusals() -> None:
    members = {k: v for k, v in VISION.items() if k != "out_hidden_size"}
    c = VisionConfig.from_component(members, 128)  # no hidden_act, rope_parameters, in_channels
    assert (c.activation, c.rope_theta, c.channels) == ("gelu_pytorch_tanh", 10000.0, 3)
    refusals = {
        "'depth' must be a positive integer": {"depth": 0},
        "hidden_act 'relu' is not one of": {"hidden_act": "relu"},
        "must split into 3 heads": {"num_heads": 3},
        "num_position_embeddings 15 is not a square": {"num_position_embeddings": 15},
    }
    for message, change in refusals.items():
        with pytest.raises(ModelError, match=message):
            VisionConfig.from_component({**members, **change}, 128)


def test_erfc_keeps_its_relative_accuracy_in_both_tails() -> None:
    z = np.linspace(-6, 9, 3001)
    exact = np.array([math.erfc(v) for v in z])
    assert np.max(np.abs(erfc(z) - exact) / exact) < 1.3e-7


def test_gelu_forms_match_torch(torch_threads) -> None:
    """The merger's exact GELU and the blocks' tanh form differ by ~1e-4 of the tower's
    output, too little for the parity tests to tell apart reliably: each is checked here."""
    torch = torch_threads
    x = np.linspace(-12, 12, 4801, dtype=np.float32)
    t = torch.from_numpy(x)
    for ours, approximate in ((gelu_erf, "none"), (gelu_tanh, "tanh")):
        ref = torch.nn.functional.gelu(t, approximate=approximate).numpy()
        assert np.max(np.abs(ours(x) - ref)) < 2e-6, approximate


# ---------------------------------------------------------------------------- refusals
def test_inputs_that_do_not_fit_the_grid_are_refused(tower) -> None:
    x = pixels(ONE_IMAGE)
    bad = {
        r"pixel_values \[24, 96\] do not match grid_thw: expected \[32, 96\]": (x, [[1, 4, 8]]),
        r"expected \[24, 96\]": (x[:, :64], ONE_IMAGE),
        "multiples of 2": (x, [[1, 3, 8]]),
        r"must be \[images, 3\]": (x, [[4, 6]]),
        "positive integers": (x, [[0, 4, 6]]),
    }
    for message, (values, grid) in bad.items():
        with pytest.raises(ModelError, match=message):
            tower.encode(values, np.array(grid))


def test_an_artifact_without_vision_is_refused(tmp_path, checkpoint) -> None:
    from ninfer_convert.pipeline import convert

    path = tmp_path / "text.ninfer"
    convert("qwen3_5_bf16", {"base": str(checkpoint)}, path, components=("text",))
    with Artifact.open(path) as art, pytest.raises(ModelError, match="no vision component"):
        VisionTower(art, get_backend("cpu"))
