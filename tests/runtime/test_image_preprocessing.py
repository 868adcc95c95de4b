"""Image input (``ninfer_runtime.frontend.vision``) against transformers' image processor for
Qwen3.5 (``Qwen2VLImageProcessorPil``: the class ``AutoImageProcessor`` gives for a Qwen3.5
checkpoint without torchvision, which this suite's environment does not install).

The preprocessing is reproduced step for step in the same dtypes, so ``pixel_values`` are
compared bit for bit and ``grid_thw`` exactly; end to end, the tower's output on our pixels is
compared with transformers' vision model on transformers' pixels at the tower's own tolerance.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="image input needs the vision extra (Pillow)")
from PIL import Image  # noqa: E402

from ninfer_format import Artifact  # noqa: E402
from ninfer_runtime.backends import get_backend  # noqa: E402
from ninfer_runtime.errors import EngineError  # noqa: E402
from ninfer_runtime.frontend.vision import (  # noqa: E402
    ImageError,
    ImageProcessor,
    decode_image,
    smart_resize,
)
from ninfer_runtime.models.qwen3_5.vision import VisionTower  # noqa: E402
from tests.runtime import test_vision_tower as tower_tests  # noqa: E402
from tests.runtime.test_vision_tower import TOL, reference, relative_error  # noqa: E402

# the tiny VLM and transformers' tower on its bf16-rounded weights, as the tower's tests build them
checkpoint = tower_tests.checkpoint
hf_bf16 = tower_tests.hf_bf16

#: the tiny VLM's processor (patch 4, merge 2: sides are multiples of 8), with a pixel budget
#: of 32×32 to 96×96 so that small and large test images both get resized
TINY = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 32 * 32, "longest_edge": 96 * 96},
}
#: (height, width): below min_pixels, wide, tall, above max_pixels, odd sides
TINY_SIZES = [(5, 7), (20, 300), (301, 33), (513, 257), (37, 41)]
#: the same shapes for transformers' defaults (patch 14, 3136 to 1003520 pixels)
DEFAULT_SIZES = [(5, 7), (60, 900), (901, 70), (1201, 901), (97, 131)]


def random_image(height: int, width: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Smooth gradients plus noise: resampling filters matter on both."""
    rng = np.random.default_rng(seed + height * 7 + width)
    yy, xx = np.mgrid[0:height, 0:width]
    ramp = np.stack([xx * 255 / max(width - 1, 1), yy * 255 / max(height - 1, 1), (xx + yy) % 256])
    noisy = ramp.transpose(1, 2, 0) + rng.normal(0, 40, (height, width, 3))
    rgb = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
    if mode == "RGBA":
        rgba = rgb.convert("RGBA")
        rgba.putalpha(Image.fromarray(rng.integers(0, 256, (height, width), dtype=np.uint8)))
        return rgba
    return rgb.convert(mode)


def hf_processor(config: dict[str, Any]) -> Any:
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**config)


def hf_process(config: dict[str, Any], images: list[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
    out = hf_processor(config)(images, return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"]


# ---------------------------------------------------------------------------- parity
@pytest.mark.parametrize(
    ("config", "sizes"), [(TINY, TINY_SIZES), ({}, DEFAULT_SIZES)], ids=["tiny", "defaults"]
)
def test_pixels_and_grids_equal_transformers(config, sizes) -> None:
    images = [random_image(h, w, seed=i) for i, (h, w) in enumerate(sizes)]
    pixel_values, grid_thw = ImageProcessor.from_config(config).process(images)
    ref_values, ref_grid = hf_process(config, images)
    assert grid_thw.dtype == np.int64 and grid_thw.tolist() == ref_grid.tolist()
    assert pixel_values.dtype == np.float32 and pixel_values.shape == ref_values.shape
    assert np.array_equal(pixel_values, ref_values)  # bit for bit


def test_the_auto_class_for_this_config_is_the_one_compared(tmp_path) -> None:
    from transformers import AutoImageProcessor

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(TINY))
    auto = AutoImageProcessor.from_pretrained(tmp_path)
    if type(auto).__name__ != "Qwen2VLImageProcessorPil":
        pytest.skip(f"torchvision is installed: transformers picks {type(auto).__name__}")
    images = [random_image(37, 41), random_image(20, 300)]
    out = auto(images, return_tensors="np")
    pixel_values, grid_thw = ImageProcessor.from_config(TINY).process(images)
    assert np.array_equal(pixel_values, out["pixel_values"])
    assert grid_thw.tolist() == out["image_grid_thw"].tolist()


@pytest.mark.parametrize("mode", ["RGBA", "LA", "L", "P", "CMYK"])
def test_other_modes_are_converted_as_transformers_does(mode) -> None:
    image = random_image(37, 41, "RGBA" if mode in ("RGBA", "LA") else "RGB", seed=3)
    if mode != "RGBA":
        image = image.convert(mode)
    if mode == "P":
        image.info["transparency"] = 0  # palette transparency counts as alpha too
    pixel_values, _ = ImageProcessor.from_config(TINY).process([image])
    assert np.array_equal(pixel_values, hf_process(TINY, [image])[0])


def test_smart_resize_equals_transformers() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf

    sides = [1, 2, 3, 7, 8, 12, 13, 27, 28, 29, 41, 56, 99, 100, 333, 1000, 1023, 4096, 10000]
    for factor, low, high in ((8, 1024, 9216), (28, 3136, 1003520), (32, 65536, 16777216)):
        for h in sides:
            for w in sides:
                if max(h, w) / min(h, w) > 200:
                    continue
                assert smart_resize(h, w, factor, low, high) == hf(h, w, factor, low, high)


def test_grid_counts_the_patches_transformers_counts() -> None:
    hf = hf_processor(TINY)
    ours = ImageProcessor.from_config(TINY)
    for h, w in [*TINY_SIZES, (8, 8), (1, 150), (4000, 3000)]:
        t, gh, gw = ours.grid(h, w)
        assert t == 1 and gh * gw == hf.get_number_of_image_patches(h, w)


# ---------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def vlm_artifact(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Path:
    """The tiny VLM with TINY as its preprocessor_config.json, converted once."""
    from ninfer_convert.pipeline import convert

    (checkpoint / "preprocessor_config.json").write_text(json.dumps(TINY))
    path = tmp_path_factory.mktemp("image_vlm") / "vlm.ninfer"
    convert("qwen3_5_bf16", {"base": str(checkpoint)}, path)
    return path


def test_processed_images_through_the_tower_match_transformers(vlm_artifact, hf_bf16) -> None:
    images = [random_image(h, w, seed=i) for i, (h, w) in enumerate(TINY_SIZES[:3])]
    with Artifact.open(vlm_artifact) as art:
        processor = ImageProcessor.from_artifact(art)
        tower = VisionTower(art, get_backend("cpu"))
    assert processor == ImageProcessor.from_config(TINY)
    pixel_values, grid_thw = processor.process(images)
    got = tower.encode(pixel_values, grid_thw)

    ref_values, ref_grid = hf_process(TINY, images)
    ref = reference(hf_bf16, ref_values, ref_grid.tolist())
    assert got.shape == ref.shape == (int(grid_thw.prod(axis=1).sum()) // 4, ref.shape[1])
    assert relative_error(got, ref) < TOL


# ---------------------------------------------------------------------------- decoding
def encoded(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_decodes_to_rgb(fmt) -> None:
    image = random_image(37, 41)
    if fmt == "GIF":  # two frames: the first is the one used
        frames = [image.convert("P"), random_image(37, 41, seed=9).convert("P")]
        data = encoded(frames[0], fmt, save_all=True, append_images=frames[1:])
        expected = np.asarray(frames[0].convert("RGB"))
    else:
        lossless = {"WEBP": {"lossless": True}}.get(fmt, {})
        data = encoded(image, fmt, **lossless)
        expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    decoded = decode_image(data)
    assert decoded.mode == "RGB" and decoded.size == (41, 37)
    assert np.array_equal(np.asarray(decoded), expected)
    if fmt in ("PNG", "WEBP"):
        assert np.array_equal(np.asarray(decoded), np.asarray(image))  # lossless


def test_a_transparent_png_is_composited_onto_white_as_transformers_does() -> None:
    image = random_image(37, 41, "RGBA", seed=4)
    decoded = decode_image(encoded(image, "PNG"))
    processor = ImageProcessor.from_config(TINY)
    assert np.array_equal(processor.process([decoded])[0], hf_process(TINY, [image])[0])


def test_the_exif_orientation_is_applied() -> None:
    image = random_image(37, 41)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: shown turned 90° clockwise
    decoded = decode_image(encoded(image, "PNG", exif=exif))
    assert decoded.size == (37, 41)
    assert np.array_equal(
        np.asarray(decoded), np.asarray(image.transpose(Image.Transpose.ROTATE_270))
    )


def png_header(width: int, height: int) -> bytes:
    """A PNG claiming ``width`` × ``height`` RGB whose IDAT holds only a first, all-zero row:
    the start of a decompression bomb (zeros compress ~1000:1, so 30 GB fit in ~30 MB)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = zlib.compress(bytes(1 + 3 * width))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", row)


def test_bad_payloads_are_refused_in_one_line_quickly() -> None:
    whole = encoded(random_image(64, 64), "PNG")
    cases = {
        "truncated or corrupt": whole[: len(whole) // 2],
        "not a PNG, JPEG, WebP or GIF": np.random.default_rng(0).bytes(4096),
        r"10000x10000 \(100000000 pixels\), more than the limit of 40000000": png_header(
            10000, 10000
        ),
        "image data is empty": b"",
    }
    for message, data in cases.items():
        start = time.perf_counter()
        with pytest.raises(ImageError, match=message) as caught:
            decode_image(data)
        assert time.perf_counter() - start < 1.0
        assert "\n" not in str(caught.value) and caught.value.code == "invalid_image"
    bmp = encoded(random_image(8, 8), "BMP")
    with pytest.raises(ImageError, match="not a PNG, JPEG, WebP or GIF"):
        decode_image(bmp)
    with pytest.raises(ImageError, match="more than the limit of 1000"):
        decode_image(whole, max_bytes=1000)
    with pytest.raises(ImageError, match=r"64x64 \(4096 pixels\), more than the limit of 4000"):
        decode_image(whole, max_pixels=4000)


def test_extreme_aspect_ratios_are_refused() -> None:
    with pytest.raises(ImageError, match="aspect ratio must be at most 200"):
        ImageProcessor.from_config(TINY).process([Image.new("RGB", (1005, 5))])


# ---------------------------------------------------------------------------- config
def test_defaults_are_transformers_defaults() -> None:
    hf = hf_processor({})
    ours = ImageProcessor.from_config({})
    assert (ours.patch_size, ours.temporal_patch_size, ours.merge_size) == (
        hf.patch_size,
        hf.temporal_patch_size,
        hf.merge_size,
    )
    assert (ours.min_pixels, ours.max_pixels) == (hf.size.shortest_edge, hf.size.longest_edge)
    assert ours.image_mean == tuple(hf.image_mean) and ours.image_std == tuple(hf.image_std)
    assert (ours.resample, ours.rescale_factor) == (int(hf.resample), hf.rescale_factor)


def test_null_members_take_the_defaults() -> None:
    nulls = {"do_resize": None, "image_mean": None, "patch_size": None, "size": None}
    assert ImageProcessor.from_config(nulls) == ImageProcessor.from_config({})


def test_top_level_min_and_max_pixels_override_size() -> None:
    config = {**TINY, "min_pixels": 100, "max_pixels": 5000}
    ours = ImageProcessor.from_config(config)
    assert (ours.min_pixels, ours.max_pixels) == (100, 5000)
    hf = hf_processor(config)
    assert (hf.size.shortest_edge, hf.size.longest_edge) == (100, 5000)


def test_bad_config_values_are_refused_in_one_line() -> None:
    refusals = {
        "merge_size must be a positive integer, got 0": {"merge_size": 0},
        "patch_size must be a positive integer, got 14.0": {"patch_size": 14.0},
        "min_pixels 9000 exceeds max_pixels 100": {"min_pixels": 9000, "max_pixels": 100},
        "max_pixels must be a positive integer": {"size": {"longest_edge": -1}},
        "size must be an object": {"size": [1, 2]},
        "resample must be a Pillow filter number 0-5, got 9": {"resample": 9},
        "do_resize must be true or false": {"do_resize": "yes"},
        "rescale_factor must be a positive number": {"rescale_factor": 0},
        "image_mean must be three numbers": {"image_mean": [0.5, 0.5]},
        "image_std must not hold 0": {"image_std": [0.5, 0, 0.5]},
    }
    for message, change in refusals.items():
        with pytest.raises(EngineError, match=message) as caught:
            ImageProcessor.from_config({**TINY, **change})
        assert str(caught.value).startswith("artifact resource 'preprocessor_config.json': ")


def test_the_text_frontend_does_not_import_pillow() -> None:
    code = "import sys, ninfer_runtime.frontend, ninfer_runtime.runner; print('PIL' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
