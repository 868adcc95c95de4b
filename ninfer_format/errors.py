"""Error types of the v3 container.

Every failure of reading, validating, decoding or writing an artifact is an ``ArtifactError``
whose message names the file, object or field at fault. Validation collects every problem it
finds; ``problems`` holds one line each so tools can print them individually.
"""

from __future__ import annotations


class ArtifactError(Exception):
    """Base class: something about an artifact (or a request to build one) is wrong."""

    def __init__(self, message: str | None = None, problems: list[str] | None = None):
        self.problems = list(problems) if problems else [message or "invalid artifact"]
        super().__init__(message or "; ".join(self.problems))


class FramingError(ArtifactError):
    """Headers, magic numbers, file sizes (R1, R2, R7)."""


class DirectoryError(ArtifactError):
    """The JSON directory: text, schema, or cross-references (R3-R6, R8-R12)."""


class PartFileError(ArtifactError):
    """A continuation file is missing, foreign, short or malformed (R15)."""


class CodecError(ArtifactError):
    """A format/layout is unknown, mismatched, or an object's bytes disagree with it (R13, R14)."""


class ResourceError(ArtifactError):
    """A resource role, encoding or body is wrong."""


class LookupFailed(ArtifactError, KeyError):
    """A requested object, parameter, component or role does not exist."""

    def __str__(self) -> str:  # KeyError would add quotes
        return Exception.__str__(self)


class WriteError(ArtifactError):
    """The writer was asked for something it cannot produce, or could not publish the output."""


class TargetExists(WriteError):
    """The output path exists and replacing it was not asked for."""

    def __init__(self, path: object):
        self.path = path
        super().__init__(f"{path}: already exists (overwrite=True replaces it)")


class MissingFile(ArtifactError, FileNotFoundError):
    """The entry file named by the user does not exist or is not a regular file."""

    def __str__(self) -> str:
        return Exception.__str__(self)
