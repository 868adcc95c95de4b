"""What one op resolution costs the host: ``registry.resolve`` of an op already resolved once.

    python benchmarks/op_resolve_bench.py [--calls 200000]

Model code resolves its ops on every call (so an override or a profile's patched op takes
effect at once), and a prefill chunk issues about fifteen ops a layer eagerly: this is what
each of those look-ups adds to the host's issue time. Per key shape (the norm family's
device only, the delta rule's four keywords, the linear product's six), the median over five
runs of ``--calls`` resolutions, in ns a call; beside it the floor, an empty function called
with the same keywords.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from ninfer_runtime.ops import registry

#: name -> (family, op, key)
KEYS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "norm.rms_norm": ("norm", "rms_norm", {"device": "cpu"}),
    "delta_rule.decode": (
        "delta_rule",
        "decode",
        {"device": "cpu", "key_dim": 128, "value_dim": 128, "taps": 4},
    ),
    "linear.product": (
        "linear",
        "product",
        {
            "device": "cpu",
            "code": 2,
            "tiled": False,
            "tensor_cores": False,
            "m": 1,
            "weights": 1 << 20,
        },
    ),
}


def ns_per_call(fn: Callable[[], Any], calls: int) -> float:
    """The median of five runs of ``calls`` calls, ns a call."""
    runs = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000, help="resolutions a run")
    args = parser.parse_args()

    def empty(**_: Any) -> None:
        return None

    print(f"{'op':20s} {'resolve ns':>11s} {'floor ns':>9s}")
    for name, (family, op, key) in KEYS.items():
        registry.resolve(family, op, **key)  # the first resolution: the policy's walk, logged
        resolve = ns_per_call(lambda f=family, o=op, k=key: registry.resolve(f, o, **k), args.calls)
        floor = ns_per_call(lambda k=key: empty(**k), args.calls)
        print(f"{name:20s} {resolve:11.0f} {floor:9.0f}")


if __name__ == "__main__":
    main()
