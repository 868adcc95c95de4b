"""Opening an artifact's entry file: rules R1-R12, checked from the entry alone.

The header, the JSON directory and the entry's size are read and validated here; nothing of
the payload or of the continuation files is touched (see ``payload_files``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import FramingError, MissingFile
from .framing import HEADER_BYTES, EntryHeader, parse_entry_header
from .jsontext import parse_directory_text
from .schema import Directory
from .validate import check_directory, parse_directory

#: A directory larger than this is refused before it is read (100k objects take ~20 MB).
MAX_DIRECTORY_BYTES = 512 * 1024 * 1024


def read_entry(path: Path) -> tuple[Directory, EntryHeader]:
    """The validated directory and header of the entry file at ``path``."""
    if not path.is_file():
        raise _not_an_entry(path)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            header = parse_entry_header(fh.read(HEADER_BYTES), size, path.name)
            if header.json_bytes > MAX_DIRECTORY_BYTES:
                raise FramingError(
                    f"{path.name}: directory of {header.json_bytes} bytes exceeds the "
                    f"{MAX_DIRECTORY_BYTES}-byte limit"
                )
            raw = fh.read(header.json_bytes)
    except OSError as exc:
        raise FramingError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) != header.json_bytes:
        raise FramingError(f"{path.name}: file ends inside the JSON directory")
    with _collector_paused():
        directory = parse_directory(parse_directory_text(raw))
        check_directory(directory, path.name)
    expected = header.payload_start + directory.files[0].payload_bytes
    if size != expected:
        raise FramingError(
            f"{path.name}: file is {size} bytes, expected {expected} (payload start "
            f"{header.payload_start} + files[0].payload_bytes "
            f"{directory.files[0].payload_bytes})"
        )
    return directory, header


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Building ~10^6 small containers triggers the cyclic GC over and over; none form cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _not_an_entry(path: Path) -> MissingFile:
    if path.is_dir():
        entries = sorted(p.name for p in path.glob("*.ninfer") if p.is_file())
        listed = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        return MissingFile(
            f"{path}: is a directory; an artifact is opened by its entry file"
            + (f" (here: {listed})" if entries else " (none here ends in .ninfer)")
        )
    if path.exists():
        return MissingFile(f"{path}: not a regular file; an artifact is opened by its entry file")
    return MissingFile(f"{path}: no such file")
