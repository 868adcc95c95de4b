"""The parts of ``benchmarks/serve_bench.py``, one job to a module: what it sends
(``workload``), the HTTP client that times it (``client``), the engine run alone as a baseline
(``engine_baseline``), the server subprocess (``server_process``), the figures (``stats``),
their text (``report``, ``run_info``) and the two workloads end to end (``runs``).

Importing it asks for one BLAS thread in this process (unless the environment says otherwise)
before anything loads numpy: the server runs so, and an engine run in this process (the
baseline, ``agent_steps.py``'s replay) must compare like with like.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
#: the repository: the server runs there, and the commit named in the report is its checkout's
ROOT = Path(__file__).resolve().parents[2]
