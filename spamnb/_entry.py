"""The ``spamnb`` console script: ``filter`` takes the fast path, the rest click.

Kept tiny on purpose: importing :mod:`spamnb.cli` pulls in click, and its
commands numpy, scipy and joblib (~0.3 s), which a per-message mail filter
cannot afford. ``spamnb filter`` goes to :mod:`spamnb.delivery.fastfilter`, which
falls back to the click command itself whenever it cannot answer.
"""

import sys


def main():
    args = sys.argv[1:]
    if args[:1] == ["filter"]:
        from spamnb.delivery.fastfilter import main as filter_main

        filter_main(args[1:])
        return
    from spamnb.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
