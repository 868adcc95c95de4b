"""Test recipe: every projection Q8 (small matrices bf16), for tiny checkpoints."""

from ninfer_convert.recipe import Recipe

from ._common import Q8, uniform


def build() -> Recipe:
    return uniform(Recipe("tiny_q8", __doc__.strip()), Q8)
