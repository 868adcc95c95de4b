"""Expert offload's host experts on torch's CPU int4 kernel (the moe family's
``host_products`` provider ``torch_int4``, which serves the host share beside a GPU): a q4
weight repacked for it multiplies as its stored codes decode, within bf16 activations; what
it cannot read stays with the reference; the tiny MoE model with every routed expert on the
host gives the all-resident greedy tokens and logits within the bf16 bound."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from ninfer_format import Artifact
from ninfer_format.codecs.gguf_block_types import FORMAT_BLOCKS
from ninfer_format.codecs.registry import codec_for
from ninfer_runtime.engine import Engine
from ninfer_runtime.expert_offload.host_cache import hold_hottest
from ninfer_runtime.expert_offload.host_experts import HostCompute, HostExpert
from ninfer_runtime.expert_offload.stored_weights import HostWeight, StoredRows
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.moe.host_int4 import FORMATS, TorchInt4, host_products
from ninfer_runtime.ops.moe.reference import TOLERANCE
from tests.runtime.offload_runs import CONTEXT, budget_shares
from tests.runtime.test_expert_offload import greedy

RTOL, ATOL = TOLERANCE["torch_int4"]


def stored(fmt: str, values: np.ndarray, layout: str | None = None) -> StoredRows:
    """``values`` encoded as ``fmt`` in ``layout`` (None: the one the kernel reads it in)."""
    layout = layout or FORMATS[fmt][0]
    data = codec_for(fmt, layout).encode(values)
    return StoredRows(fmt, layout, np.frombuffer(data, np.uint8), values.shape)


#: GGUF's K-quants, which are imported and never written here: random blocks stand in
K_QUANTS = {"gguf_q4_k", "gguf_q5_k"}


def random_blocks(fmt: str, shape: tuple[int, int], rng: np.random.Generator) -> StoredRows:
    """Random K-quant blocks (any codes and 6-bit scales; d and dmin small and positive)."""
    _, values, nbytes = FORMAT_BLOCKS[fmt]
    blocks = rng.integers(0, 256, (shape[0] * shape[1] // values, nbytes), dtype=np.uint8)
    for at in (0, 2):  # d, dmin
        half = rng.uniform(1e-4, 1e-3, len(blocks)).astype(np.float16)
        blocks[:, at : at + 2] = half.view(np.uint8).reshape(-1, 2)
    return StoredRows(fmt, FORMATS[fmt][0], blocks.reshape(-1), shape)


def pieces_of(fmt: str, values: np.ndarray, rng: np.random.Generator) -> list[StoredRows]:
    """``values`` [96, K] as two stored pieces of 32 and 64 rows (K-quants: random blocks)."""
    if fmt in K_QUANTS:
        return [random_blocks(fmt, (n, values.shape[1]), rng) for n in (32, 64)]
    return [stored(fmt, values[:32]), stored(fmt, values[32:])]


def decoded(pieces: list[StoredRows]) -> np.ndarray:
    return np.concatenate([p.decode() for p in pieces])


def bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).float().numpy()


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_packed_weight_multiplies_as_its_codes_decode(fmt, rows):
    rng = np.random.default_rng(0)
    values = rng.standard_normal((96, 256)).astype(np.float32) * 0.05
    values[5, 64:128] = 0  # a group whose scale is 0
    pieces = pieces_of(fmt, values, rng)
    w = TorchInt4.pack(pieces, None)
    _, bits, group = FORMATS[fmt]
    planes = 1 if bits == 4 else 2
    assert w is not None and w.shape == (96, 256) and w.planes == planes
    # codes, 4 bits a plane; a bf16 scale and zero a group a plane
    assert w.nbytes == planes * (96 * 256 // 2 + 4 * 96 * 256 // group)
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    out = TorchInt4.linear(x, w)
    assert out.dtype == np.float32 and out.shape == (rows, 96)
    # the same codes and bf16 rows and scales, accumulated in float64: only the order and
    # the output's rounding to bf16 differ
    exact = bf16(x).astype(np.float64) @ decoded(pieces).T.astype(np.float64)
    # bounds: the scales, the weights the kernel forms (bf16 operands) and the output
    # rounded to bf16, 2^-9 of the largest each, and a plane's share rounded apart
    bound = 2**-7 * np.abs(exact).max()
    np.testing.assert_allclose(out, exact, rtol=0, atol=bound)
    assert np.abs(out - exact).max() > 0  # bf16 in: not the float32 reference's numbers


def test_what_the_kernel_cannot_read_stays_with_the_reference():
    rng = np.random.default_rng(1)
    q4 = rng.standard_normal((32, 128)).astype(np.float32)
    direct = stored("bf16", q4, "contiguous_le_v1")
    assert TorchInt4.pack([direct], None) is None  # a format it does not read
    mixed = [stored("q4_g64_fp16", q4[:16]), stored("q8_g32_fp16", q4[16:])]
    assert TorchInt4.pack(mixed, None) is None
    assert TorchInt4.pack([stored("q4_g64_fp16", q4[:24])], None) is None  # rows % 16
    assert TorchInt4.pack([stored("q4_g64_fp16", q4[:, :96])], None) is None  # a part group
    assert TorchInt4.pack([stored("q4_g64_fp16", q4)], np.arange(128)[::-1]) is None
    assert TorchInt4.pack([stored("q4_g64_fp16", q4)], None) is not None
    # an expert with one weight the kernel cannot read keeps its stored form, and its numbers
    gate, up = (stored("q4_g64_fp16", q4) for _ in range(2))
    down = stored("bf16", rng.standard_normal((128, 32)).astype(np.float32), "contiguous_le_v1")
    expert = HostExpert(*(HostWeight((p,), None, None) for p in (gate, up, down)))
    x = rng.standard_normal((2, 128)).astype(np.float32)
    before = expert(x)
    assert not expert.pack(host_products()) and expert.packed is None
    np.testing.assert_array_equal(expert(x), before)
    # gate and up pack as one weight: formats that differ between them keep the stored form
    down = stored("q4_g64_fp16", rng.standard_normal((128, 32)).astype(np.float32))
    up = stored("q8_g32_fp16", q4)
    expert = HostExpert(*(HostWeight((p,), None, None) for p in (gate, up, down)))
    before = expert(x)
    assert not expert.pack(host_products()) and expert.packed is None
    np.testing.assert_array_equal(expert(x), before)


def test_a_packed_expert_takes_no_decoded_copy_and_computes_on_the_kernel(q4_moe):
    art = Artifact.open(q4_moe)
    prefixes = [f"text/layers/0/moe/experts/{i}/" for i in range(2)]
    experts = [HostExpert.load(art, p) for p in prefixes]
    x = np.random.default_rng(2).standard_normal((4, experts[0].hidden)).astype(np.float32)
    reference = [HostExpert.load(art, p)(x) for p in prefixes]
    stored_bytes = experts[0].nbytes
    host = HostCompute(2, kernel=host_products())
    try:
        assert host.pack(experts[:1]) == 1
    finally:
        host.close()
    packed, kept = experts
    assert packed.packed is not None and kept.packed is None
    assert stored_bytes < packed.nbytes < 1.3 * stored_bytes  # codes as stored, wider scales
    with pytest.raises(ValueError, match="packed host expert"):
        packed.weights()
    assert hold_hottest([(9.0, packed), (1.0, kept)], 10 * kept.decoded_bytes) == (
        kept.decoded_bytes
    )
    assert packed.held is None and kept.held is not None
    scale = np.abs(reference[0]).max()
    np.testing.assert_allclose(packed(x), reference[0], rtol=RTOL, atol=ATOL * scale)
    assert not np.array_equal(packed(x), reference[0])


@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_q5"])
def test_the_engine_with_every_expert_on_the_kernel_keeps_greedy_tokens(
    artifact_path, recipe, caplog
):
    """The policy's torch_int4 forced beside the CPU backend (it serves the GPU's host
    share): all 16 host experts packed, the all-resident tokens, logits within bf16's bound
    (the host's pairs carry bf16 rows and scales; the rest is the float32 reference)."""
    path = artifact_path(recipe, "moe")
    reference = greedy(Engine(path, max_context=CONTEXT, max_lanes=1).runner, 6)
    floor = budget_shares(path)[0]
    with (
        registry.override("moe", "host_products", "torch_int4"),
        caplog.at_level(logging.INFO, "ninfer.expert_offload"),
    ):
        e = Engine(path, max_context=CONTEXT, max_lanes=1, vram_budget=floor)
        tokens, logits = greedy(e.runner, 6)
    experts = [x for b in e.expert_offload.blocks for x in b.host_experts.values()]
    assert len(experts) == 16 and all(x.packed is not None for x in experts)
    assert "16 host experts packed for torch_int4" in caplog.text
    assert e.expert_offload.counters.host_total > 0
    assert tokens == reference[0]
    scale = np.abs(reference[1]).max()
    np.testing.assert_allclose(logits, reference[1], rtol=RTOL, atol=ATOL * scale)
    assert not np.array_equal(logits, reference[1])


def test_the_policy_packs_beside_a_gpu_and_not_beside_the_cpu_backend():
    assert registry.resolve("moe", "host_products", device="cpu")() is None
    assert isinstance(registry.resolve("moe", "host_products", device="cuda")(), TorchInt4)


def test_a_threads_core_count_holds_whatever_another_thread_set() -> None:
    """A pool thread asks for 1 core, another thread then sets 2, and the first asks for 1
    again: torch then reports 1 on it. (A new thread's first use of torch takes the count
    the process set last, whatever it set itself before: a count remembered per thread
    left it on the other thread's.)"""
    import threading

    import torch

    kernel = TorchInt4()
    before = torch.get_num_threads()
    turn, seen = threading.Event(), []

    def pool_thread() -> None:
        kernel.use_threads(1)
        turn.wait()
        kernel.use_threads(1)
        seen.append(torch.get_num_threads())

    try:
        worker = threading.Thread(target=pool_thread)
        worker.start()
        other = threading.Thread(target=kernel.use_threads, args=(2,))
        other.start()
        other.join()
        turn.set()
        worker.join()
        assert seen == [1]
    finally:
        torch.set_num_threads(before)


class CountingKernel:
    """A stand-in kernel that records the cores each expert's thread was given."""

    name = "counting"

    def __init__(self) -> None:
        self.given: list[tuple[str, int]] = []

    def use_threads(self, threads: int) -> None:
        import threading

        self.given.append((threading.current_thread().name, threads))


@pytest.mark.parametrize(
    ("threads", "kernel_threads", "rows", "chosen", "cores", "side"),
    [
        (16, None, 1, 5, 16, 1),  # default: every core on one expert after another
        (16, None, 1, 32, 16, 1),
        (16, None, 8, 8, 16, 1),  # at several rows too
        (2, 4, 8, 8, 2, 1),  # (no more cores than the host has)
        (16, 4, 1, 8, 4, 4),  # 4 cores an expert, 4 experts side by side
        (16, 16, 8, 8, 16, 1),  # every core on one expert at a time
    ],
)
def test_how_the_host_gives_its_cores_to_the_chosen_experts(
    threads, kernel_threads, rows, chosen, cores, side
):
    kernel = CountingKernel()
    host = HostCompute(threads, kernel=kernel, kernel_threads=kernel_threads)
    try:
        x = np.ones((rows, 4), dtype=np.float32)
        experts = {e: (lambda r, e=e: r * (e + 1)) for e in range(chosen)}
        top = np.arange(chosen)[None, :].repeat(rows, axis=0)  # every row to every expert
        share = np.full((rows, chosen), 0.5, dtype=np.float32)
        out = host(x, top, share, experts)
    finally:
        host.close()
    np.testing.assert_allclose(out, 0.5 * sum(range(1, chosen + 1)) * x)
    # one task a group of experts side by side, each giving its thread the same cores
    assert {n for _, n in kernel.given} == {cores} and len(kernel.given) == side
    # the calling thread computes the first group; the pool the others
    callers = [name for name, _ in kernel.given]
    assert callers.count("MainThread") == 1
