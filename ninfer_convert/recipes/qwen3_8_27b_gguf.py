"""Qwen3.8-27B from a llama.cpp GGUF (--source gguf=FILE.gguf; the base directory supplies
config.json and the tokenizer files only): every text and MTP matrix keeps its GGUF blocks
verbatim (gguf_* formats, AllowA8); GDN a/b and float-stored matrices bf16; norms, A_log,
dt_bias and the convolution cast from the GGUF values (notes 4.3); vision
(when the base holds it) from the base in upstream's formats."""

from ninfer_convert.recipe import Recipe

from ._common import gguf_blocks


def build() -> Recipe:
    return gguf_blocks("qwen3_8_27b_gguf", __doc__.strip())
