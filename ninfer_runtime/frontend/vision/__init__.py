"""Image input for the vision tower: request bytes -> ``PIL.Image`` (``decode``), images ->
``pixel_values`` and ``grid_thw`` as the checkpoint's image processor makes them
(``processor``). Needs Pillow (the ``vision`` extra); ``ninfer_runtime.frontend`` does not import
this package, so text-only use never loads it.

    processor = ImageProcessor.from_artifact(artifact)   # or .from_config(dict)
    pixel_values, grid_thw = processor.process([decode_image(data) for data in payloads])
    embeddings = VisionTower(artifact, backend).encode(pixel_values, grid_thw)
"""

from .decode import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, decode_image, to_rgb
from .errors import ImageError
from .processor import ImageProcessor, smart_resize

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PIXELS",
    "ImageError",
    "ImageProcessor",
    "decode_image",
    "smart_resize",
    "to_rgb",
]
