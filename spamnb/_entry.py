"""The ``spamnb`` console script: ``filter`` takes the fast path, the rest click.

Kept tiny on purpose: importing :mod:`spamnb.cli` pulls in click, and its
commands numpy, scipy and joblib, which a per-message mail filter cannot
afford. ``spamnb filter`` goes to :mod:`spamnb.delivery.fastfilter`, which
falls back to the click command (:func:`load_cli`) whenever it cannot answer.
"""

import sys


def load_cli():
    """The click group of :mod:`spamnb.cli` (imported only when needed)."""
    from spamnb.cli import main as cli_main

    return cli_main


def main():
    args = sys.argv[1:]
    if args[:1] == ["filter"]:
        from spamnb.delivery.fastfilter import main as filter_main

        filter_main(args[1:], load_cli)
        return
    load_cli()()


if __name__ == "__main__":
    main()
