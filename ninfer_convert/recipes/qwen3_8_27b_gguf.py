"""Qwen3.8-27B from a llama.cpp GGUF (qwen35; --source FILE.gguf alone, its metadata giving the
config and the tokenizer, or --source gguf=FILE.gguf with a base directory for config.json and
the tokenizer files): every text and MTP matrix keeps its GGUF blocks verbatim (gguf_* formats,
AllowA8); GDN a/b and float-stored matrices bf16; norms, A_log, dt_bias and the convolution
cast from the GGUF values (notes 4.3); vision (when a base directory holds it) from the base in
upstream's formats."""

from ninfer_convert.recipe import Recipe

from ._common import gguf_blocks


def build() -> Recipe:
    return gguf_blocks("qwen3_8_27b_gguf", __doc__.strip())
