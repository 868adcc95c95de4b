"""``ninfer-bench``: synthetic artifacts of the official geometries, for engine benchmarks."""
