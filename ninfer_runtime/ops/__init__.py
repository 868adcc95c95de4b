"""The runtime's compute, by op family: each family owns its reference (the numpy oracle), its
policy (THE table of which provider serves an op on a device, for which shapes) and its
providers (our kernels, or a public kernel library where it measures faster in the same run).
``registry.resolve`` is the one way an op finds its provider; the choice is logged.

Families so far: ``delta_rule`` (Gated DeltaNet: chunked prefill, decode, speculative
verification and commit), ``attention`` (K/V writes, decode and prefill attention over the
paged K/V; the K/V memory kind), ``linear`` (small-M products of packed weights), ``moe``
(the MoE block and routers), ``norm`` (RMS norms) and ``sampling`` (token scores).
``torch_interop`` is how a provider on a torch-based library shares CuPy's arrays and
stream.
"""
