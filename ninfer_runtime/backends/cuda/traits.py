"""What the CUDA backend is, known without CuPy: the class attributes the engine and the
server read before a backend exists (the lane limit, the K/V default), so a setting is judged
alike on a machine with a GPU and one without. ``CudaBackend`` inherits them."""

from __future__ import annotations

from ...lane_limits import MAX_LANES


class CudaTraits:
    name = "cuda"
    #: the most lanes (rows of a decode step) the kernels take: the device sampler, the
    #: small-M products and the MoE decode path all run up to 64 rows; a decode graph is
    #: captured per lane count the first time that count runs
    max_lanes = MAX_LANES
    #: K/V with ``kv_dtype`` auto: bfloat16, the production precision (half float32's bytes
    #: for decode attention to read; float32 stays a setting)
    kv_dtype = "bfloat16"
    #: prompt tokens a step when the engine is given no ``prefill_chunk``: a chunk's host
    #: issue and its products' weight dequantization are paid once a chunk whatever its
    #: rows (on the 27B, an H100 prefilled ~4,500 tok/s in the server's 1,024-token chunks
    #: and ~8,000 in ninfer-bench's 2,048: docs/performance.md); a generating lane waits
    #: for one chunk a step
    prefill_chunk = 2048
