"""``python -m ninfer_serve``: the same as the ``ninfer-serve`` command."""

from ninfer_serve.cli import main

if __name__ == "__main__":
    main()
