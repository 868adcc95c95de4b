"""benchmarks/image_bench.py end to end on the CPU: a tiny synthetic geometry with a tiny vision
tower (``ninfer-bench synth --vision``), one run on a small image. Nothing here is timed as a
pass/fail criterion: the figures must exist and be positive, the counts must be the
processor's and the config's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_format.verify import verify
from ninfer_runtime.bench.cli import main as bench_cli
from ninfer_runtime.bench.synthetic import plan_synthetic
from ninfer_runtime.bench.synthetic.vision import FULL_TOWER, TINY_TOWER, processor_config
from ninfer_runtime.frontend.vision import ImageProcessor
from ninfer_runtime.models.qwen3_5.vision import VisionConfig
from tests.benchmarks import load_benchmark

IMAGE = 40  # pixels a side: 10×10 patches of 4 pixels, 25 merged tokens


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("image_bench") / "tv.ninfer"
    args = ["synth", "--geometry", "tiny_dense", "--formats", "qwen3_6_27b", "--vision"]
    result = CliRunner().invoke(bench_cli, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "vision" in result.output
    return out


def test_synthetic_vision_component_is_valid(artifact) -> None:
    with Artifact.open(artifact) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert not art.binder_report.warnings, art.binder_report.warnings
        checked = verify(art, strict=True)
        assert checked.ok and not checked.warnings, checked.errors + checked.warnings
        vision = art.components["vision"]
        assert vision.config["depth"] == TINY_TOWER["depth"]
        assert vision.config["out_hidden_size"] == art.components["text"].config["hidden_size"]
        processor = json.loads(art.resource("preprocessor_config.json", "vision"))
        assert processor["patch_size"] == vision.config["patch_size"]
        for name in ("vision/layers/0/norm1_weight", "vision/merger/fc2"):
            assert np.isfinite(art.parameter(name)).all(), name
        assert abs(float(np.mean(art.parameter("vision/layers/0/norm1_weight"))) - 1) < 0.1


def test_full_size_tower_is_the_released_geometry() -> None:
    plan = plan_synthetic("qwen3_6_27b", "qwen3_6_27b", vision=True)
    config = plan.components["vision"]["config"]
    assert (config["depth"], config["hidden_size"], config["out_hidden_size"]) == (27, 1152, 5120)
    assert config["model_type"] == "qwen3_5_vision"
    assert plan.logical["vision/merger/fc2"].shape == (5120, 4 * 1152)
    assert plan.bytes_by_component()["vision"] > 0
    with pytest.raises(ValueError, match="--vision"):
        plan_synthetic("glm5next", "glm5next", vision=True)


def test_encoder_flops_of_the_full_tower_at_1024() -> None:
    bench = load_benchmark("image_bench")
    config = VisionConfig.from_component(FULL_TOWER, 5120)
    processor = ImageProcessor.from_config(processor_config("qwen3_6_27b", FULL_TOWER))
    grid = np.array([processor.grid(1024, 1024)])
    assert grid.tolist() == [[1, 64, 64]]
    n, h, i = 4096, 1152, 4304
    block = 2 * n * (4 * h * h + 2 * h * i) + 4 * n * n * h
    merger = 2 * 1024 * (4 * h) ** 2 + 2 * 1024 * 4 * h * 5120
    assert bench.encoder_flops(config, grid) == 2 * n * 1536 * h + 27 * block + merger


def test_image_bench_runs_end_to_end(artifact, tmp_path) -> None:
    bench = load_benchmark("image_bench")
    out = tmp_path / "image.json"
    argv = ["--model", str(artifact), "--backend", "cpu", "--image-size", str(IMAGE)]
    bench.main([*argv, "--runs", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["grid_thw"] == [1, IMAGE // 4, IMAGE // 4]
    assert result["image_tokens"] == (IMAGE // 8) ** 2
    assert result["prompt_tokens"] > result["image_tokens"]
    assert len(result["answer_tokens"]) == 1
    assert 0 <= result["answer_tokens"][0] < 512  # tiny_dense's vocabulary
    figures = {f["what"]: f for f in result["figures"]}
    assert set(figures) == {"time to first token", "image encode", "text prefill",
                            "preprocess (cpu)"}  # fmt: skip
    assert all(f["ms"] > 0 for f in figures.values())
    for what in ("image encode", "text prefill", "time to first token"):
        assert figures[what]["gflop"] > 0 and figures[what]["floor_ms"] > 0, what
    assert result["matmul_tflops"] > 0
