"""Checkpoint conversion into .ninfer v3 artifacts (sources, recipes, quantizers)."""
