"""Test recipe: every projection NF4 (small matrices bf16), for tiny checkpoints."""

from ninfer_convert.recipe import Recipe

from ._common import NF4, uniform


def build() -> Recipe:
    return uniform(Recipe("tiny_nf4", __doc__.strip()), NF4)
