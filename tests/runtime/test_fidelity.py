"""The CPU engine against transformers on tiny random Qwen3.5 models (dense and MoE).

References are transformers models in fp32 holding exactly the weights the engine runs: the
checkpoint rounded through bf16 for the lossless recipes, the artifact's decoded values for the
quantized ones. Any remaining difference is the engine's math, so the tolerance is tight
(1e-4 on logits of std ~0.6, where mapping mistakes cost 0.05-2.5; notes 5.11).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.errors import EngineError, ModelError
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner

from .conftest import QUALITY_ROWS

TOL = 1e-4
VOCAB = 512
BF16_RECIPES = {"dense": "qwen3_5_bf16", "moe": "qwen3_5_moe_bf16"}
QUANTIZED = {  # recipe -> minimum top-1 agreement with the bf16 model
    "tiny_q4": 0.55,
    "tiny_q5": 0.75,
    "tiny_q6": 0.85,
    "tiny_q8": 0.9,
    "tiny_nvfp4": 0.6,
    "tiny_fp8": 0.9,
    "tiny_nf4": 0.6,
}


def prompt(length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, length)


def max_abs(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# -------------------------------------------------------------------------- references
def round_through_bf16(model: Any) -> None:
    """What the bf16 recipes store: every weight bf16, except GDN A_log / dt_bias (fp32)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("A_log", "dt_bias")):
                p.copy_(p.to(torch.bfloat16).float())


def hf_forward(model: Any, ids: np.ndarray, **kwargs: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(ids)[None], **kwargs)


@pytest.fixture(scope="session")
def hf_bf16(checkpoints: dict[str, Path], torch_threads: Any) -> Callable[[str], Any]:
    """``hf_bf16(kind)``: transformers' fp32 model on the bf16-rounded checkpoint, plus its
    MtpModel (notes 6), built once per kind."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import MtpModel

    cache: dict[str, Any] = {}

    def get(kind: str) -> Any:
        if kind not in cache:
            main = AutoModelForCausalLM.from_pretrained(checkpoints[kind], dtype="float32").eval()
            main.config.num_mtp_layers = 1
            main.config.mtp_layer_types = ["full_attention"]
            mtp = MtpModel.from_pretrained(main).eval()
            round_through_bf16(main)
            round_through_bf16(mtp)
            cache[kind] = SimpleNamespace(main=main, mtp=mtp)
        return cache[kind]

    return get


def hf_with_artifact_weights(checkpoint: Path, art: Artifact) -> Any:
    """transformers' model with every weight replaced by the artifact's decoded values.

    The logical -> HF mapping is written out here, independently of the converter: query and
    gate interleave per head into q_proj, GDN query/key/value stack into in_proj_qkv, the
    convolution is stored [K, C] and HF wants [C, 1, K], experts fuse gate/up.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype="float32").eval()
    c = model.config
    params = dict(model.named_parameters())
    written: set[str] = set()

    def put(hf_name: str, value: np.ndarray) -> None:
        target = params[hf_name]
        with torch.no_grad():
            target.copy_(torch.from_numpy(np.ascontiguousarray(value)).reshape(target.shape))
        written.add(hf_name)

    def p(name: str) -> np.ndarray:
        return art.parameter(name)

    put("model.embed_tokens.weight", p("text/token_embedding"))
    put("lm_head.weight", p("text/output_head"))
    put("model.norm.weight", p("text/final_norm"))
    for i, kind in enumerate(c.layer_types):
        L, H = f"text/layers/{i}/", f"model.layers.{i}."
        put(H + "input_layernorm.weight", p(L + "input_norm"))
        put(H + "post_attention_layernorm.weight", p(L + "post_attention_norm"))
        if kind == "full_attention":
            d, heads = c.head_dim, c.num_attention_heads
            q = p(L + "attention/query").reshape(heads, 1, d, -1)
            g = p(L + "attention/gate").reshape(heads, 1, d, -1)
            put(H + "self_attn.q_proj.weight", np.concatenate([q, g], axis=1))
            for logical, hf in [
                ("key", "k_proj"),
                ("value", "v_proj"),
                ("output", "o_proj"),
                ("query_norm", "q_norm"),
                ("key_norm", "k_norm"),
            ]:
                put(f"{H}self_attn.{hf}.weight", p(L + "attention/" + logical))
        else:
            G = H + "linear_attn."
            qkv = [p(L + "gdn/" + s) for s in ("query", "key", "value")]
            put(G + "in_proj_qkv.weight", np.concatenate(qkv, axis=0))
            put(G + "conv1d.weight", p(L + "gdn/convolution").T)
            for logical, hf in [
                ("z", "in_proj_z.weight"),
                ("a_projection", "in_proj_a.weight"),
                ("b_projection", "in_proj_b.weight"),
                ("a_log", "A_log"),
                ("dt_bias", "dt_bias"),
                ("norm", "norm.weight"),
                ("output", "out_proj.weight"),
            ]:
                put(G + hf, p(L + "gdn/" + logical))
        if hasattr(c, "num_experts"):
            M = H + "mlp."
            put(M + "gate.weight", p(L + "moe/router"))
            put(M + "shared_expert_gate.weight", p(L + "moe/shared_score"))
            for s in ("gate", "up", "down"):
                put(f"{M}shared_expert.{s}_proj.weight", p(f"{L}moe/shared/{s}"))
            experts = [f"{L}moe/experts/{e}/" for e in range(c.num_experts)]
            put(
                M + "experts.gate_up_proj",
                np.stack([np.concatenate([p(e + "gate"), p(e + "up")]) for e in experts]),
            )
            put(M + "experts.down_proj", np.stack([p(e + "down") for e in experts]))
        else:
            for s in ("gate", "up", "down"):
                put(f"{H}mlp.{s}_proj.weight", p(f"{L}mlp/{s}"))
    assert written == set(params), sorted(set(params) - written)
    return model


# ---------------------------------------------------------------------- bf16, dense + MoE
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_bf16_prefill_chunks_and_decode_match_transformers(
    kind: str, artifact_path: Callable[[str, str], Path], hf_bf16: Callable[[str], Any]
) -> None:
    runner = ModelRunner(load_model(artifact_path(BF16_RECIPES[kind], kind)))
    ids = prompt(155)

    whole = runner.new_state(256)
    prefill = runner.forward([ids], [whole]).logits[0]
    chunked = runner.new_state(256)
    pieces = [
        runner.forward([ids[a:b]], [chunked]).logits[0] for a, b in [(0, 50), (50, 110), (110, 155)]
    ]
    greedy, decode = [int(np.argmax(prefill[-1]))], []
    for _ in range(32):
        decode.append(runner.forward([np.array(greedy[-1:])], [whole]).logits[0][0])
        greedy.append(int(np.argmax(decode[-1])))
    greedy = greedy[:32]

    ref = hf_forward(hf_bf16(kind).main, np.concatenate([ids, greedy])).logits[0].numpy()
    errors = {
        "prefill": max_abs(prefill, ref[:155]),
        "chunked 50+60+45": max_abs(np.concatenate(pieces), ref[:155]),
        "decode x32": max_abs(np.stack(decode), ref[155:187]),
    }
    print(kind, {k: f"{v:.2e}" for k, v in errors.items()}, f"logit std {ref.std():.2f}")
    assert all(v < TOL for v in errors.values()), errors
    assert greedy == np.argmax(ref[154:186], axis=-1).tolist()  # greedy under HF's logits
    assert whole.length == 187 and chunked.length == 155


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_batched_decode_equals_each_lane_alone(
    kind: str, artifact_path: Callable[[str, str], Path]
) -> None:
    runner = ModelRunner(load_model(artifact_path(BF16_RECIPES[kind], kind)))
    prompts = [prompt(n, seed=n) for n in (9, 70, 131)]
    # lanes of one batch share a pool; small pages so sequences span several, out of order
    pool = runner.new_pool(lanes=4, max_context=160, page_tokens=16)
    assert pool.pages == 40
    pool.open(40)  # a slot and pages taken first, so the lanes' ids are not 0, 1, 2 ...
    batched = [pool.open(160) for _ in prompts]
    alone = [runner.new_state(160) for _ in prompts]
    last = []
    for ids, a, b in zip(prompts, batched, alone, strict=True):
        last.append(runner.forward([ids], [a], last_only=True).logits[0][0])
        runner.prefill(ids, b, chunk=32)  # the chunked-prefill helper must agree too
    tokens = [int(np.argmax(x)) for x in last]
    worst = 0.0
    for _ in range(6):
        out = runner.forward([np.array([t]) for t in tokens], batched).logits
        for lane, (t, state) in enumerate(zip(tokens, alone, strict=True)):
            single = runner.forward([np.array([t])], [state]).logits[0]
            worst = max(worst, max_abs(out[lane], single))
        tokens = [int(np.argmax(x[0])) for x in out]
    assert worst < 1e-5, worst
    assert [s.length for s in batched] == [15, 76, 137]


# --------------------------------------------------------------------------------- MTP
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_mtp_draft_logits_match_transformers_mtp_model(
    kind: str, artifact_path: Callable[[str, str], Path], hf_bf16: Callable[[str], Any]
) -> None:
    import torch
    from transformers.cache_utils import MtpCache

    ref_models = hf_bf16(kind)
    ids = prompt(60, seed=3)
    out = hf_forward(ref_models.main, ids, output_hidden_states=True)
    h = out.hidden_states[-1]  # post-final-norm
    ids_t, pos = torch.as_tensor(ids)[None], torch.arange(len(ids))[None]
    with torch.no_grad():
        cache = MtpCache(config=ref_models.main.config.get_mtp_config())
        hm = ref_models.mtp.forward_layer(0, h[:, :-1], pos[:, 1:], cache, input_ids=ids_t[:, 1:])
        ref = ref_models.mtp._project_to_logits(hm)[0].numpy()

    runner = ModelRunner(load_model(artifact_path(BF16_RECIPES[kind], kind)))
    state = runner.new_state(64)
    hidden = runner.forward([ids], [state]).hidden[0]
    # in two calls, so the second reads the MTP layer's own cache from the first
    first = runner.mtp_logits(hidden[:25], ids[1:26], state)
    second = runner.mtp_logits(hidden[25:59], ids[26:60], state)
    error = max_abs(np.concatenate([first, second]), ref)
    print(kind, f"mtp draft logits max|Δ| {error:.2e}")
    assert error < TOL
    assert state.mtp_length == 59


# --------------------------------------------------------------------------- quantized
@pytest.fixture(scope="session")
def bf16_quality_logits(artifact_path: Callable[[str, str], Path]) -> np.ndarray:
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", "dense")))
    return runner.forward([prompt(150, seed=7)], [runner.new_state(150)]).logits[0]


@pytest.mark.parametrize("recipe", list(QUANTIZED))
def test_quantized_matches_transformers_on_decoded_weights(
    recipe: str,
    artifact_path: Callable[[str, str], Path],
    checkpoints: dict[str, Path],
    bf16_quality_logits: np.ndarray,
) -> None:
    art = Artifact.open(artifact_path(recipe, "dense"))
    runner = ModelRunner(load_model(art))
    ids = prompt(150, seed=7)
    state = runner.new_state(160)
    logits = runner.forward([ids], [state]).logits[0]
    decode = [runner.forward([np.array([t])], [state]).logits[0][0] for t in (5, 77, 300)]

    reference = hf_with_artifact_weights(checkpoints["dense"], art)
    ref = hf_forward(reference, np.concatenate([ids, [5, 77, 300]])).logits[0].numpy()
    error = max(max_abs(logits, ref[:150]), max_abs(np.stack(decode), ref[150:]))

    top1 = float(np.mean(np.argmax(logits, -1) == np.argmax(bf16_quality_logits, -1)))
    kl = mean_kl(bf16_quality_logits, logits)
    QUALITY_ROWS.append((recipe, top1, kl, error))
    print(f"{recipe}: max|Δ| vs HF {error:.2e}, top-1 vs bf16 {top1:.3f}, KL {kl:.5f}")
    assert error < TOL
    assert top1 >= QUANTIZED[recipe]
    assert 0.0 < kl < 0.5


def mean_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean over positions of KL(p || q), in float64."""

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


# ------------------------------------------------------------- mistakes must be visible
def swap_query_and_gate(name: str, values: np.ndarray, art: Artifact) -> np.ndarray:
    for mine, other in (
        ("attention/query", "attention/gate"),
        ("attention/gate", "attention/query"),
    ):
        if name.endswith(mine):
            return ORIGINAL_PARAMETER(art, name.replace(mine, other))
    return values


def tile_gdn_value_heads(name: str, values: np.ndarray, art: Artifact) -> np.ndarray:
    """Reorder value heads as if the source grouped them tiled (h -> key h % Hk) instead of
    interleaved (h -> key h // r): every per-value-head tensor consistently, so only the
    key-head pairing is wrong."""
    hk, hv, dv = 2, 4, 64  # tests/tiny_checkpoints.COMMON
    r = hv // hk
    perm = [(j % hk) * r + j // hk for j in range(hv)]
    if "/gdn/" not in name:
        return values
    suffix = name.rsplit("/", 1)[1]
    if suffix in ("value", "z", "a_projection", "b_projection", "a_log", "dt_bias"):
        shape = values.shape
        return values.reshape(hv, -1)[perm].reshape(shape)
    if suffix == "output":
        return values.reshape(values.shape[0], hv, dv)[:, perm].reshape(values.shape)
    if suffix == "convolution":  # [K, q | k | v]
        out = values.copy()
        vg = hv * dv
        out[:, -vg:] = values[:, -vg:].reshape(-1, hv, dv)[:, perm].reshape(-1, vg)
        return out
    return values


ORIGINAL_PARAMETER = Artifact.parameter


@pytest.mark.parametrize("mistake", [swap_query_and_gate, tile_gdn_value_heads])
def test_wrong_weight_mapping_is_caught(
    mistake: Callable[..., np.ndarray],
    artifact_path: Callable[[str, str], Path],
    hf_bf16: Callable[[str], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def wrong_loader(self: Artifact, name: str, shape: Any = None, **kw: Any) -> np.ndarray:
        return mistake(name, ORIGINAL_PARAMETER(self, name, shape, **kw), self)

    ids = prompt(40, seed=11)
    ref = hf_forward(hf_bf16("dense").main, ids).logits[0].numpy()
    monkeypatch.setattr(Artifact, "parameter", wrong_loader)
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", "dense")))
    error = max_abs(runner.forward([ids], [runner.new_state(40)]).logits[0], ref)
    print(mistake.__name__, f"max|Δ| {error:.3f}")
    assert error > 0.1


# ------------------------------------------------------------------------------ errors
def test_errors_name_what_is_wrong(artifact_path: Callable[[str, str], Path]) -> None:
    art = Artifact.open(artifact_path("qwen3_5_bf16", "dense"))
    runner = ModelRunner(load_model(art))
    state = runner.new_state(16)
    runner.forward([prompt(10)], [state])
    with pytest.raises(EngineError, match=r"lane 0: 7 tokens do not fit.*10 of max_context 16"):
        runner.forward([prompt(7)], [state])
    assert state.length == 10  # a refused call changes nothing

    foreign = SimpleNamespace(components={"text": SimpleNamespace(config={"model_type": "llama"})})
    with pytest.raises(ModelError, match=r"no model for architecture llama; known: .*qwen3_5_text"):
        load_model(foreign)

    text_only_artifact = SimpleNamespace(
        components={"text": art.components["text"]},
        bindings=art.bindings,
        parameter=art.parameter,
        uses=art.uses,
    )
    text_only = ModelRunner(load_model(text_only_artifact))
    with pytest.raises(ModelError, match="artifact has no mtp component"):
        text_only.mtp_logits(np.zeros((1, 128), np.float32), np.array([1]), state)
