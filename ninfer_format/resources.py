"""Resource encodings: ``raw_bytes_v1`` (CORE) and ``zstd_v1`` (ninfer extension)."""

from __future__ import annotations

from collections.abc import Callable

from .errors import ResourceError

#: Largest decompressed resource: tokenizer files are ~10 MB; this bounds a hostile frame.
MAX_RESOURCE_BYTES = 256 << 20


def _zstd_encode(raw: bytes) -> bytes:
    import zstandard

    # the frame's own checksum lets a decoder notice a damaged frame that still parses
    return zstandard.ZstdCompressor(level=19, write_checksum=True).compress(raw)


def _zstd_decode(stored: bytes) -> bytes:
    """Exactly one whole frame that declares its size (our encoder always does): truncated
    frames, trailing bytes and frame checksum mismatches are errors, and nothing larger than
    the cap is allocated, whatever a hostile header claims."""
    import zstandard

    try:
        declared = zstandard.get_frame_parameters(stored).content_size
        if declared == zstandard.CONTENTSIZE_UNKNOWN:
            raise ResourceError("zstd_v1 frame does not declare its content size")
        if declared > MAX_RESOURCE_BYTES:
            raise ResourceError(
                f"zstd_v1 resource declares {declared} bytes, beyond the "
                f"{MAX_RESOURCE_BYTES}-byte limit"
            )
        return zstandard.ZstdDecompressor().decompress(stored, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise ResourceError(f"zstd_v1 resource does not decompress: {exc}") from None


ENCODINGS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    "raw_bytes_v1": (bytes, bytes),
    "zstd_v1": (_zstd_encode, _zstd_decode),
}
CORE_ENCODINGS = {"raw_bytes_v1"}


def _pair(encoding: str) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    try:
        return ENCODINGS[encoding]
    except KeyError:
        raise ResourceError(
            f"resource encoding {encoding!r} is not implemented (known: {sorted(ENCODINGS)})"
        ) from None


def encode_resource(encoding: str, raw: bytes) -> bytes:
    if not raw:
        raise ResourceError("a resource must not be empty")
    return _pair(encoding)[0](raw)


def decode_resource(encoding: str, stored: bytes) -> bytes:
    return _pair(encoding)[1](stored)
