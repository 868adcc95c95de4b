"""Qwen3.6-35B-A3B from a llama.cpp GGUF (qwen35moe; --source FILE.gguf alone, its metadata
giving the config and the tokenizer, or --source gguf=FILE.gguf with a base directory for
config.json and the tokenizer files): every text and MTP matrix keeps its GGUF blocks verbatim
(gguf_* formats, AllowA8), each routed expert its run of the expert banks' rows; the router,
the shared-expert score, GDN a/b and float-stored matrices bf16; norms, A_log, dt_bias and the
convolution cast from the GGUF values; vision (when a base directory holds it) from the base
in upstream's formats."""

from ninfer_convert.recipe import Recipe

from ._common import gguf_blocks


def build() -> Recipe:
    return gguf_blocks("qwen3_6_35b_a3b_gguf", __doc__.strip())
