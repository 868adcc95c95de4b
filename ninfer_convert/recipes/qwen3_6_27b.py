"""Qwen3.6-27B: Q4 query/key (attention, GDN) and MLP gate/up, Q5 other text projections,
a/b projections bf16, embedding and head Q6, MTP projections Q8,
vision (when present) in upstream's formats."""

from ninfer_convert.recipe import Recipe

from ._common import Q6, dense_groupwise


def build() -> Recipe:
    return dense_groupwise(Recipe("qwen3_6_27b", __doc__.strip()), (Q6, Q6))
