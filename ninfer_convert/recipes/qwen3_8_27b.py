"""Qwen3.8-27B: as qwen3_6_27b (Q4/Q5 text projections, a/b bf16, MTP Q8, vision as
upstream) with embedding and head Q8."""

from ninfer_convert.recipe import Recipe

from ._common import Q8, dense_groupwise


def build() -> Recipe:
    return dense_groupwise(Recipe("qwen3_8_27b", __doc__.strip()), (Q8, Q8))
