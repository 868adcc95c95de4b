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
