"""The runtime's compute, by op family: each family owns its reference (the numpy oracle), its
policy (THE table of which provider serves an op on a device, for which shapes) and its
providers (our kernels, or a public kernel library where it measures faster in the same run).
``registry.resolve`` is the one way an op finds its provider; the choice is logged.

Families so far: ``delta_rule`` (the Gated DeltaNet chunked prefill).
"""
