"""Test recipe: every projection Q6 (small matrices bf16), for tiny checkpoints."""

from ninfer_convert.recipe import Recipe

from ._common import Q6, uniform


def build() -> Recipe:
    return uniform(Recipe("tiny_q6", __doc__.strip()), Q6)
