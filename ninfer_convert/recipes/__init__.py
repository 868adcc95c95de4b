"""Conversion recipes, one module per model, discovered by name."""
