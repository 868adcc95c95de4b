"""Attention over the paged K/V cache of full-attention layers (and the MTP layer).

So far the family holds its memory kind, ``memory.py``: keys and values in pages of the
context pool. Its reference, policy and providers are to join it here as the other families'
do (``ops/delta_rule``).
"""
