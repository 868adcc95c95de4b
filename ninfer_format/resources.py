"""Resource encodings: ``raw_bytes_v1`` (CORE) and ``zstd_v1`` (ninfer extension)."""

from __future__ import annotations

from collections.abc import Callable

from .errors import ResourceError

_MAX_RESOURCE = 1 << 32  # 4 GiB of decompressed resource is far beyond any tokenizer file


def _zstd_encode(raw: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=19).compress(raw)


def _zstd_decode(stored: bytes) -> bytes:
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompress(stored, max_output_size=_MAX_RESOURCE)
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
