"""Test recipe: every projection FP8 (small matrices bf16), for tiny checkpoints."""

from ninfer_convert.recipe import Recipe

from ._common import FP8, uniform


def build() -> Recipe:
    return uniform(Recipe("tiny_fp8", __doc__.strip()), FP8)
