"""GLM5Next's vision tower on the CPU (``ninfer_runtime.models.glm5_next.vision``) against
transformers' ``Glm5NextVisionModel`` (its merger's output, ``pooler_output``) on a tiny random
checkpoint converted with ``glm5_next_bf16``.

The reference runs in float32 on the artifact's values (every vision weight bf16-rounded, as the
recipe stores it), so what remains is the tower's math: max |Δ| within 1e-5 of max |reference|
(a wrong rotary layout, merge order or downsample flattening costs 1e-2 and more). The SwiGLU
limit is set low (1.0), so the clamps of the blocks' MLP and the merger both bite.

The grids exercise one image, two images of different sizes in one call and a two-frame video
(each frame its own attention segment); malformed vision configs and inputs are one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends import get_backend
from ninfer_runtime.errors import ModelError
from ninfer_runtime.models.glm5_next.vision import Glm5NextVisionTower
from ninfer_runtime.models.glm5_next.vision_config import Glm5NextVisionConfig

tiny = pytest.importorskip("tests.tiny_glm5_next")
torch = pytest.importorskip("torch")

TOL = 1e-5
#: patch 4, merge 2, head size 16; out_hidden_size is the text hidden size
VISION: dict[str, Any] = dict(
    depth=2, hidden_size=32, num_heads=2, intermediate_size=48, patch_size=4,
    temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=tiny.TEXT["hidden_size"],
    projection_intermediate_size=64, swiglu_limit=1.0,
)  # fmt: skip
PATCH_WIDTH = 3 * 2 * 4 * 4
GRIDS = {
    "one": [[1, 4, 6]],
    "two": [[1, 4, 6], [1, 8, 4]],
    "video": [[2, 4, 4], [1, 2, 2]],
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("glm5_next_vision")
    checkpoint = tiny.build_tiny_glm5_next(root / "checkpoint", mtp=False, vision=VISION)
    tiny.convert("glm5_next_bf16", checkpoint, root / "tiny.ninfer")
    return checkpoint, root / "tiny.ninfer"


@pytest.fixture(scope="module")
def reference(converted: tuple[Path, Path]) -> Any:
    """transformers' tower, every weight rounded through bf16 as the artifact stores it."""
    visual = tiny.build_model(vision=VISION).model.visual
    with torch.no_grad():
        for p in visual.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return visual.eval()


@pytest.fixture(scope="module")
def tower(converted: tuple[Path, Path]) -> Glm5NextVisionTower:
    with Artifact.open(converted[1]) as artifact:
        return Glm5NextVisionTower(artifact, get_backend("cpu"))


@pytest.mark.parametrize("grid", list(GRIDS.values()), ids=list(GRIDS))
def test_tower_matches_transformers(tower, reference, grid) -> None:
    grid = np.asarray(grid, dtype=np.int64)
    patches = int(np.prod(grid, axis=1).sum())
    pixels = np.random.default_rng(patches).normal(size=(patches, PATCH_WIDTH))
    pixels = pixels.astype(np.float32)
    with torch.no_grad():
        out = reference(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid))
    expected = out.pooler_output.numpy()
    ours = np.asarray(tower.encode(pixels, grid))
    assert (
        ours.shape == expected.shape == (sum(tower.merged_tokens(grid)), VISION["out_hidden_size"])
    )
    assert np.abs(ours - expected).max() <= TOL * np.abs(expected).max()


def test_bad_inputs_are_one_line(tower) -> None:
    with pytest.raises(ModelError, match=r"do not match grid_thw: expected \[24, 96\]"):
        tower.encode(np.zeros((23, PATCH_WIDTH), np.float32), np.array([[1, 4, 6]]))
    with pytest.raises(ModelError, match="multiples of 2"):
        tower.encode(np.zeros((15, PATCH_WIDTH), np.float32), np.array([[1, 3, 5]]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"depth": 0}, "'depth' must be a positive integer, got 0"),
        ({"num_heads": 3}, "'hidden_size' (32) must split into num_heads (3)"),
        ({"out_hidden_size": 64}, "'out_hidden_size' must be the text hidden size 128, got 64"),
        ({"swiglu_limit": -1}, "'swiglu_limit' must be a positive number"),
        ({"hidden_act": "relu2"}, "hidden_act 'relu2' is not one of"),
        ({"rope_parameters": {"rope_type": "default"}}, "only the axial rope"),
    ],
)
def test_malformed_vision_config_is_one_line(change, message) -> None:
    config = {**VISION, **change}
    with pytest.raises(ModelError) as raised:
        Glm5NextVisionConfig.from_component(config, tiny.TEXT["hidden_size"])
    assert message in str(raised.value) and "\n" not in str(raised.value)
