"""Checkpoint conversion into .ninfer v3 artifacts (sources, adapters, recipes, quantizers)."""

__version__ = "0.1.0"
