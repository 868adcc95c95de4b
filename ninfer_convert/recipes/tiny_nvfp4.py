"""Test recipe: every projection NVFP4 (small matrices bf16), for tiny checkpoints."""

from ninfer_convert.recipe import Recipe

from ._common import NVFP4, uniform


def build() -> Recipe:
    return uniform(Recipe("tiny_nvfp4", __doc__.strip()), NVFP4)
