"""Test recipe: every projection Q4 (small matrices bf16), for tiny checkpoints."""

from ninfer_convert.recipe import Recipe

from ._common import Q4, uniform


def build() -> Recipe:
    return uniform(Recipe("tiny_q4", __doc__.strip()), Q4)
