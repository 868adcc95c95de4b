"""Error types of the converter: every failure names the source, recipe or tensor at fault."""

from __future__ import annotations


class ConvertError(Exception):
    """Base class: a conversion cannot proceed as asked."""


class RecipeError(ConvertError):
    """A recipe (or an override) is malformed or does not fit the model."""


class SourceError(ConvertError):
    """A checkpoint source cannot be opened or does not hold what was asked of it."""


class OutputExists(ConvertError):
    """The output artifact exists and ``force`` was not given."""

    def __init__(self, path: object):
        self.path = path
        super().__init__(f"{path}: already exists (force=True replaces it)")
