"""The attack families of the reliability benchmark (``benchmarks/reliability.py``), one module
each, with what they share: the time budget and tally (``bookkeeping``), the repository's paths
(``paths``), the live server of the HTTP families (``live_server``), the order the families run
in (``runner``) and the printed table and JSON report (``report``).

A package beside the benchmark scripts: ``reliability.py`` imports it as ``reliability_attacks``
(its own folder is first on ``sys.path`` when run); its modules import one another relatively.
"""
