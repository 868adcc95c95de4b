"""The ``.ninfer`` v3 container: schema, reader, writer, codecs, binders. numpy only."""

from .errors import (
    ArtifactError,
    CodecError,
    DirectoryError,
    FramingError,
    LookupFailed,
    MissingFile,
    PartFileError,
    ResourceError,
    TargetExists,
    WriteError,
)
from .reader import Artifact
from .writer import ArtifactWriter, ResourceSpec, TensorSpec

__all__ = [
    "Artifact",
    "ArtifactError",
    "ArtifactWriter",
    "CodecError",
    "DirectoryError",
    "FramingError",
    "LookupFailed",
    "MissingFile",
    "PartFileError",
    "ResourceError",
    "ResourceSpec",
    "TargetExists",
    "TensorSpec",
    "WriteError",
]
__version__ = "0.1.0"
