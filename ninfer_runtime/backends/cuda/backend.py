"""The CUDA backend: packed weights read in place by our kernels, CuPy for the glue.

``linear`` is the hot path. For few rows (batched decode, an expert's share of a prefill chunk)
it runs the small-M product of the weight's layout over each resident segment (the linear
family's ``product``, ``ops/linear``: tensor cores for row_split q4..q8, NVFP4 and bf16 up to
64 rows, or the SIMT GEMV, 8 rows per launch, where it is faster, as for one row or small
weights, or where the layout has no tensor-core kernel, NF4, FP8 and the ``gguf_*`` blocks, up
to 64 rows; tile-packed objects on the tile kernel); for more
rows (prefill chunks) it rounds x to bfloat16, dequantizes the weight, a slab of rows at a
time, to bfloat16 in scratch buffers that a side stream fills while the previous slab's
product runs (``slabs.py``; bf16 weights are read in place) and multiplies with
``cublasGemmEx`` on tensor cores, accumulating in float32 (``prefill.py``).
``prefill_precision="tf32"`` or ``"float32"`` keeps float32 scratch slabs and ``cp.matmul``
with TF32 or full float32 math. The other decode-step ops (MoE routing and experts, RMSNorm,
RoPE) have kernels of their own, so a decode step never waits on the host and is captured once
per lane count as a CUDA graph (``graphs.py``). Attention over the paged K/V (``attention.py``,
``prefill_attention.py``), the delta rule (``gdn.py``, ``gdn_prefill.py``) and the MoE block
(``moe.py``) are served through the op catalogue (``ops/attention``, ``ops/delta_rule``,
``ops/moe``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import cupy as cp
import cupyx
import numpy as np
from cupy_backends.cuda.libs import cublas

from ...ops.linear import matmul, product_key
from ...ops.registry import resolve
from ...sizes import format_size
from .. import array_ops as ops
from ..base import Array, Weight
from . import glue, kernels, prefill, sampling
from .constants import device_constant
from .expert_streaming import PinnedCuts, Prefetch
from .graphs import GraphStep
from .host_node import HostNode
from .mapped_weights import MappedWeights, MappingError
from .slabs import SlabBuffers
from .traits import CudaTraits
from .weight_kinds import DenseWeight, PackedWeight, Segment
from .weights import Residency
from .workspace import SCRATCH_BYTES, prefill_workspace

log = logging.getLogger("ninfer.cuda")

#: cublasMath_t CUBLAS_TF32_TENSOR_OP_MATH (cublas_api.h); CuPy does not export the name
TF32_TENSOR_OP_MATH = 3
#: how the small-M products take x (``CudaBackend.decode_precision``) -> the linear family's op
#: that serves it: "bf16" (x rounded once, the production precision and the default) or
#: "split" (x as two halves where a kernel has them, ~16 bits: what the GPU tests compare
#: token for token with the CPU reference on random models)
DECODE_PRODUCTS = {"split": "product", "bf16": "product_bf16"}


class CudaBackend(CudaTraits, ops.ReferenceOps):
    """The CUDA backend (its name, lane limit and K/V default: ``CudaTraits``)."""

    xp = cp

    def __init__(
        self,
        *,
        graphs: bool = True,
        host_nodes: bool = False,
        prefill_precision: str = "bf16",
        decode_precision: str = "bf16",
    ) -> None:
        self.residency = Residency(cp)
        self._slabs = SlabBuffers(SCRATCH_BYTES)
        self.graphs = graphs
        # prefill products (rows past the small-M kernels): "bf16" (bf16 operands, float32
        # accumulation), "tf32" (float32 operands, 10-bit mantissas inside the tensor cores)
        # or "float32"
        self.prefill_precision = prefill.check_precision(prefill_precision)
        tf32 = prefill_precision == "tf32"
        # cuBLAS math mode of the float32 products: TF32 only when asked for
        self._math_mode = TF32_TENSOR_OP_MATH if tf32 else cublas.CUBLAS_DEFAULT_MATH
        if decode_precision not in DECODE_PRODUCTS:
            raise ValueError(
                f"decode precision {decode_precision!r}: expected one of "
                f"{', '.join(DECODE_PRODUCTS)}"
            )
        self.decode_precision = decode_precision
        # decode graphs run on a blocking stream (ordered after the legacy default stream the
        # rest of the work uses) and allocate from a pool no other work touches
        self._stream = cp.cuda.Stream(non_blocking=False)
        self._graph_pool = cp.cuda.MemoryPool()
        #: whether ``host_node`` is offered (expert offload's host share in captured steps)
        self.host_nodes = host_nodes
        #: bumped when weights a captured step may read are replaced (``forget_graphs``)
        self.graph_epoch = 0
        self._host_nodes: list[HostNode] = []
        #: id(MoeWeights) -> (a weak reference to those weights, their ExpertTable or None),
        #: the moe family's device tables (``ops/moe/nvrtc.py``); the reference tells a new
        #: object at a freed one's address from it, and the entry goes with the weights
        self.expert_tables: dict[int, tuple[Any, Any]] = {}
        #: id(experts) -> the ``moe_routed.RoutedTable`` of those experts, the last used last
        #: (``ops/moe/nvrtc.routed_experts``: each checks it serves the experts it is asked for)
        self.routed_tables: OrderedDict[int, Any] = OrderedDict()
        #: expert offload's streamed experts: their cuts in pinned host memory (no allowance
        #: until ``keep_streamed``) and the next layer's prefetch (made at its first use)
        self._streamed = PinnedCuts(0, lambda n: cupyx.empty_pinned((n,), dtype=np.uint8))
        self._prefetch: Prefetch | None = None
        #: expert offload's mapped experts: pinned host copies the device reads in place,
        #: kept beside the streamed experts' (a window uploads a mapped expert from there)
        self.mapped = MappedWeights(cp, self._streamed)

    # ------------------------------------------------------------------- decode steps
    def compile_step(self, fn: Any, shapes: Any, capture: bool = True) -> Any:
        if not self.graphs or not capture:
            return super().compile_step(fn, shapes)
        return GraphStep(fn, shapes, self._stream, self._graph_pool, self._graph_epoch)

    def _graph_epoch(self) -> int | None:
        """What a captured step checks before it runs: the epoch (None: steps run eagerly
        now), after raising what a host node's function raised in an earlier step (a
        replayed node reports to no Python caller)."""
        for node in self._host_nodes:
            node.check()
        return self.graph_epoch if self.graphs else None

    def forget_graphs(self) -> None:
        """Captured steps address the weights they read when captured: after some are
        replaced (expert offload placing its experts again), each step is captured afresh
        at its next call."""
        self.graph_epoch += 1

    def host_node(self, fn: Any, output_shape: Any) -> HostNode:
        """``fn`` on the host as one step of the device's stream, capturable (``HostNode``)."""
        node = HostNode(fn, output_shape)
        self._host_nodes.append(node)
        return node

    def device_sampler(self) -> Any:
        return sampling.DeviceSampler()

    def context_budget(self, headroom: int | None = None) -> int | None:
        """Free device memory less ``headroom`` for activations, decode graphs and other
        processes (default: 2 GiB or 5% of the device, whichever is more) and the scratch."""
        free, total = cp.cuda.runtime.memGetInfo()
        pool = cp.get_default_memory_pool()
        free += pool.free_bytes()  # cached by CuPy, reusable
        if headroom is None:
            headroom = max(2 << 30, total // 20)
        return max(int(free) - headroom - 3 * SCRATCH_BYTES, 0)

    def device_workspace(self, config: Any, rows: int, logit_rows: int) -> int:
        """Device bytes beside the weights and the context pool for prefill calls of up to
        ``rows`` rows, ``logit_rows`` of them scored, of the model its text ``config``
        describes (``workspace.py``): the dequantization scratch (the captured products'
        buffer while decode steps are captured), the MoE routers' copies and the widest
        point's activations and logits."""
        return prefill_workspace(config, rows, logit_rows, captured=bool(self.graphs))

    @property
    def load_report(self) -> Any:
        return self.residency.report

    # ------------------------------------------------------------------------ weights
    def prepare(self, artifact: Any, names: Iterable[str]) -> dict[str, Weight]:
        return self.residency.prepare(artifact, names)

    def release(self, weights: Iterable[Weight]) -> None:
        """Let the row windows ``weights`` are built on go with them (expert offload's
        streamed experts and experts placed back in host memory: ``Residency.release``)."""
        self.residency.release(weights)

    def prepare_mapped(self, artifact: Any, names: Iterable[str]) -> dict[str, Weight]:
        """``prepare``, the weights then moved to pinned host memory, which the device reads
        in place (``mapped_weights``; the device copy is released); ``MappingError`` for a
        weight not held as stored rows, or where host memory cannot be pinned for it."""
        made = self.residency.prepare(artifact, names)
        try:
            return self.mapped.of(made)
        except (cp.cuda.memory.OutOfMemoryError, cp.cuda.runtime.CUDARuntimeError) as err:
            pinned = format_size(self.mapped.kept.used)
            raise MappingError(
                f"no more host memory could be pinned ({pinned} are): {err}"
            ) from None
        finally:
            self.residency.release(made.values())

    # ------------------------------------------------------------- streamed experts
    def keep_streamed(self, capacity: int) -> None:
        """Keep streamed experts' cuts in pinned host memory, up to ``capacity`` bytes
        (``expert_streaming``)."""
        self._streamed.capacity = capacity

    def prepare_streamed(self, artifact: Any, groups: list[list[str]]) -> list[dict[str, Weight]]:
        """``prepare`` for experts streamed through the device (expert offload's prefill
        window), each group one expert's weight names: their cuts read from, or kept in,
        pinned host memory, once the copies a ``prefetch_experts`` started are done on the
        device."""
        if self._prefetch is not None:
            self._prefetch.settle()
        with self.residency.streaming(self._streamed):
            return self.residency.prepare_groups(artifact, groups)

    def prefetch_experts(self, artifact: Any, groups: Iterable[Iterable[str]]) -> None:
        """Prepare experts (each group one expert's weight names) on a second stream while
        the current layer computes; the last prefetch's experts that its layer did not use
        are let go."""
        if self._prefetch is None:
            self._prefetch = Prefetch(cp)

        def work() -> list[Weight]:
            with self.residency.streaming(self._streamed):
                made = self.residency.prepare_groups(artifact, [list(g) for g in groups])
            return [w for weights in made for w in weights.values()]

        self.residency.release(self._prefetch.start(work))

    def join_rows(self, weights: list[Weight]) -> Weight:
        """One weight whose rows are the given weights' rows in order; segments that continue
        one another in the same object merge, so a packed Q|K|V is one GEMV launch."""
        if not all(isinstance(w, PackedWeight) and w.input_columns is None for w in weights):
            return DenseWeight(cp.concatenate([self.array(w) for w in weights]))
        segments: list[Segment] = []
        for w in weights:
            for seg in w.segments:  # type: ignore[union-attr]
                last = segments[-1] if segments else None
                if last and last.parent is seg.parent and last.row0 + last.rows == seg.row0:
                    segments[-1] = Segment(seg.parent, last.row0, last.rows + seg.rows)
                else:
                    segments.append(seg)
        rows = sum(w.shape[0] for w in weights)
        return PackedWeight(segments, (rows, weights[0].shape[1]))

    def array(self, weight: Weight) -> Array:
        if isinstance(weight, DenseWeight):
            return weight.array
        assert isinstance(weight, PackedWeight)
        if weight.dense is None:
            out = cp.empty(weight.shape, dtype=cp.float32)
            start = 0
            for seg in weight.segments:
                rows = cp.arange(seg.row0, seg.row0 + seg.rows, dtype=cp.int32)
                view = out[start : start + seg.rows]
                kernels.dequant_rows(seg.parent.data, seg.parent.planes, rows, view)
                start += seg.rows
            if weight.input_columns is not None:
                placed = cp.empty_like(out)
                placed[:, weight.input_columns] = out
                out = placed
            weight.dense = out
        return weight.dense

    # ------------------------------------------------------------------ dense algebra
    def embedding(self, ids: Array, table: Weight) -> Array:
        ids = cp.asarray(ids)
        if isinstance(table, PackedWeight) and len(table.segments) == 1:
            seg = table.segments[0]
            rows = ids.astype(cp.int32) + np.int32(seg.row0)
            out = cp.empty((rows.shape[0], table.columns), dtype=cp.float32)
            kernels.dequant_rows(seg.parent.data, seg.parent.planes, rows, out)
            return out
        return self.array(table)[ids]

    def linear(self, x: Array, w: Weight) -> Array:
        if isinstance(w, DenseWeight):  # the linear family's matmul: capturable
            return matmul(x, w.array.T)
        assert isinstance(w, PackedWeight)
        m = x.shape[0]
        if m == 0:
            return cp.empty((0, w.shape[0]), dtype=cp.float32)
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        if w.input_columns is not None:
            x = x[:, w.input_columns]  # the stored column order
        if self._bf16_prefill(w, m):
            return self._linear_bf16(prefill.to_bf16(x), w)
        out = cp.empty((m, w.shape[0]), dtype=cp.float32)
        col = 0
        xb = None  # segments of both kinds: x as bf16 words, made once for the prefill ones
        for seg in w.segments:
            y = out[:, col : col + seg.rows]
            if m <= kernels.max_rows(seg.parent.planes):
                self._small_product(x, seg, y, out.shape[1])
            else:
                if xb is None and self.prefill_precision == "bf16":
                    xb = prefill.to_bf16(x)
                self._dequant_matmul(x, seg, y, xb)
            col += seg.rows
        return out

    def gated_linear(self, gate_up: Array, w: Weight) -> Array:
        if (
            isinstance(w, PackedWeight)
            and w.input_columns is None
            and self._bf16_prefill(w, gate_up.shape[0])
        ):  # SiLU·up written straight as the product's bf16 operand
            return self._linear_bf16(glue.silu_mul_bf16(gate_up), w)
        return super().gated_linear(gate_up, w)

    def _bf16_prefill(self, w: PackedWeight, m: int) -> bool:
        """Whether every segment of ``w`` takes m rows as a bf16 prefill product."""
        return self.prefill_precision == "bf16" and all(
            m > kernels.max_rows(seg.parent.planes) for seg in w.segments
        )

    def _linear_bf16(self, xb: Array, w: PackedWeight) -> Array:
        """``x @ wᵀ`` from x as bf16 words (``prefill.to_bf16``), every segment a prefill
        product."""
        out = cp.empty((xb.shape[0], w.shape[0]), dtype=cp.float32)
        col = 0
        for seg in w.segments:
            self._dequant_matmul(None, seg, out[:, col : col + seg.rows], xb)
            col += seg.rows
        return out

    def _small_product(self, x: Array, seg: Segment, y: Array, ldy: int) -> None:
        p = seg.parent.planes
        if x.shape[1] != p.x_width or x.data.ptr % 16:
            padded = cp.zeros((x.shape[0], p.x_width), dtype=cp.float32)
            padded[:, : x.shape[1]] = x
            x = padded
        op = DECODE_PRODUCTS[self.decode_precision]
        product = resolve("linear", op, **product_key(p, seg.rows, x.shape[0]))
        product(seg.parent.data, p, seg.row0, seg.rows, x, y, ldy)

    def _dequant_matmul(self, x: Array, seg: Segment, y: Array, xb: Array | None = None) -> None:
        """``y = x · W[seg]ᵀ`` for a prefill-sized x; bf16 products take x as bf16 words
        (``prefill.to_bf16``; given as xb, x is not read)."""
        # per call: CuPy keeps one cuBLAS handle per thread, and the engine may step on any
        cublas.setMathMode(cp.cuda.device.get_cublas_handle(), self._math_mode)
        p = seg.parent.planes
        k = p.columns
        bf16 = self.prefill_precision == "bf16"
        if bf16 and xb is None:
            xb = prefill.to_bf16(x)
        if bf16 and prefill.is_bf16(p):  # the stored rows are the operand as they are
            prefill.gemm_bf16(prefill.bf16_rows(seg.parent.data, p, seg.row0, seg.rows), xb, y)
            return
        dtype = np.dtype(np.uint16 if bf16 else np.float32)
        slab = prefill.slab_rows(seg.rows, self._slabs.rows(dtype, k))
        for a in range(0, seg.rows, slab):
            b = min(a + slab, seg.rows)

            def dequantize(w: Array, a: int = a, b: int = b) -> None:
                first, last = seg.row0 + a, seg.row0 + b
                rows = device_constant(
                    ("rows", first, last), lambda: cp.arange(first, last, dtype=cp.int32)
                )
                kernels.dequant_rows(seg.parent.data, p, rows, w)

            w, ticket = self._slabs.fill(b - a, k, dtype, dequantize)
            if bf16:
                prefill.gemm_bf16(w, xb, y[:, a:b])
            else:
                y[:, a:b] = cp.matmul(x, w.T)
            self._slabs.release(ticket)

    # ---------------------------------------------------------------------------- glue
    def rope(self, x: Array, cos: Array, sin: Array) -> Array:
        return glue.rope(x, cos, sin)
