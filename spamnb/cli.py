"""The ``spamnb`` command line: a thin click layer over the library.

Commands import what they need inside their own bodies, so that the
per-message ``filter`` hook does not pay for modules it never uses.
"""

import click

from spamnb._version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spamnb")
def main():
    """spamnb: a naive Bayes spam filter for your own mail.

    \b
    Example:
      spamnb train --index corpora/spamassassin.tar.xz --model model.joblib
      spamnb classify --model model.joblib ~/Maildir
    """
