"""The serving benchmark's one error: a run that cannot give figures, which the command line
reports in one line instead of a traceback."""


class BenchError(Exception):
    """A run that cannot give figures (no request succeeded, the server did not start)."""
