"""Profile a decode run of ``ninfer-bench run`` under ``--vram-budget`` with cProfile, INFO
logs on (expert offload's plan and packing): where a host-bound step spends its time.

    python scripts/profile_offload.py ARTIFACT BUDGET OUT_PREFIX
"""

import contextlib
import cProfile
import logging
import pstats
import sys

from ninfer_runtime.bench.cli import main

artifact, budget, out = sys.argv[1:4]
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
sys.argv = [
    "ninfer-bench",
    "run",
    artifact,
    "--lanes",
    "1",
    "--contexts",
    "1024",
    "--steps",
    "4",
    "--prefill",
    "0",
    "--vram-budget",
    budget,
]
profile = cProfile.Profile()
with contextlib.suppress(SystemExit):
    profile.runcall(main)
profile.dump_stats(out + ".prof")
with open(out + ".txt", "w") as f:
    stats = pstats.Stats(profile, stream=f).sort_stats("tottime")
    stats.print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
