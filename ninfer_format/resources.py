"""Resource encodings: ``raw_bytes_v1`` (CORE) and ``zstd_v1`` (ninfer extension)."""

from __future__ import annotations

from collections.abc import Callable

from .errors import ResourceError

#: Largest decompressed resource: tokenizer files are ~10 MB; this bounds a hostile frame.
MAX_RESOURCE_BYTES = 256 << 20


def _zstd_encode(raw: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=19).compress(raw)


def _zstd_decode(stored: bytes) -> bytes:
    import zstandard

    try:
        # Stream with a cap: a frame header may declare any content size, and one-shot
        # decompression would allocate it before noticing the data is short.
        with zstandard.ZstdDecompressor().stream_reader(stored) as reader:
            raw = reader.read(MAX_RESOURCE_BYTES + 1)
    except zstandard.ZstdError as exc:
        raise ResourceError(f"zstd_v1 resource does not decompress: {exc}") from None
    if len(raw) > MAX_RESOURCE_BYTES:
        raise ResourceError(f"zstd_v1 resource expands beyond {MAX_RESOURCE_BYTES} bytes")
    return raw


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
