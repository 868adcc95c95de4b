"""Request bytes -> an RGB ``PIL.Image``, refusing what is not a whole, reasonably sized image.

The size check comes before any pixel is decoded: ``Image.open`` reads only the header, so a
small file that claims 100 megapixels (a decompression bomb) is refused after a few bytes of
work. Pillow's own bomb guard (``Image.MAX_IMAGE_PIXELS``) is a process-wide warning at ~89 MP;
the limit here is per call and an error.

The EXIF orientation is applied (a phone photo stored sideways is shown upright), as
transformers' ``load_image`` does. Transparency is composited onto white, as the image
processor's ``convert_to_rgb`` does to an RGBA image (and vLLM to a request's image);
``load_image`` instead drops the alpha band, keeping whatever colour transparent pixels hold.
"""

from __future__ import annotations

import io
import warnings

from ._pil import Image, ImageOps, UnidentifiedImageError
from .errors import ImageError

#: formats a request may carry (animated GIF and WebP: the first frame)
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
#: 40 MP: an 8K photo fits; the processor shrinks everything to its max_pixels anyway
DEFAULT_MAX_PIXELS = 40_000_000
#: 32 MiB of encoded bytes
DEFAULT_MAX_BYTES = 32 << 20


def decode_image(
    data: bytes,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Image.Image:
    """The first frame of a PNG, JPEG, WebP or GIF payload, fully loaded, upright, as RGB.

    Raises ``ImageError`` (one line) for an empty, oversized, unrecognised or truncated
    payload, or one whose header claims more than ``max_pixels`` pixels.
    """
    if len(data) == 0:
        raise ImageError("image data is empty")
    if len(data) > max_bytes:
        raise ImageError(f"image data is {len(data)} bytes, more than the limit of {max_bytes}")
    try:
        with warnings.catch_warnings():
            # Pillow warns (or raises) about large images itself; the check below decides
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:
        raise ImageError(f"image is too large to decode ({exc})") from None
    except UnidentifiedImageError:  # (its message names the BytesIO object, nothing useful)
        raise ImageError("image data is not a PNG, JPEG, WebP or GIF image") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"image data is not a readable image ({exc})") from None
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ImageError(
            f"image is {width}x{height} ({width * height} pixels), more than the limit of "
            f"{max_pixels}"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image.seek(0)
            image.load()
    except Image.DecompressionBombError as exc:
        raise ImageError(f"image is too large to decode ({exc})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(f"{image.format} image data is truncated or corrupt ({exc})") from None
    return to_rgb(ImageOps.exif_transpose(image))


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as RGB, transparency composited onto white (transformers' ``convert_to_rgb``:
    an alpha band or a palette's transparency both count)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")
