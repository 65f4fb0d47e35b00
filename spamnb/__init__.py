"""spamnb: a naive Bayes spam filter.

The library is usable on its own; :mod:`spamnb.cli` is a thin layer over it.
Heavy modules (numpy, scipy, joblib) are imported by the submodules that need
them, never here, so that ``import spamnb`` stays cheap for the filter hook.
"""

from spamnb._version import __version__

__all__ = ["__version__"]
