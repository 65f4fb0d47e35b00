"""The ``spamnb`` console script: ``filter``, ``learn`` and ``forget`` take fast paths, the rest click.

Kept tiny on purpose: importing :mod:`spamnb.cli` pulls in click, and its
commands numpy, scipy and joblib, which a per-message mail filter cannot
afford. ``spamnb filter`` goes to :mod:`spamnb.delivery.fastfilter`, ``learn``
and ``forget`` to :mod:`spamnb.delivery.fastlearn`; both fall back to the
click command (:func:`load_cli`) whenever they cannot answer.
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
    if args[:1] in (["learn"], ["forget"]):
        from spamnb.delivery.fastlearn import main as learn_main

        learn_main(args[0], args[1:], load_cli)
        return
    load_cli()()


if __name__ == "__main__":
    main()
