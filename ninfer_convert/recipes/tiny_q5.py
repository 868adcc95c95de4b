"""Test recipe: every projection Q5 (small matrices bf16), for tiny checkpoints."""

from ninfer_convert.recipe import Recipe

from ._common import Q5, uniform


def build() -> Recipe:
    return uniform(Recipe("tiny_q5", __doc__.strip()), Q5)
