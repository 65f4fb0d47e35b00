"""The estimator conventions of scikit-learn, without scikit-learn.

scikit-learn's tools (``clone``, ``Pipeline``, ``GridSearchCV``, ``cross_val_score``,
``CalibratedClassifierCV``, ``check_estimator``) work with any object that keeps
a few conventions; this module is spamnb's own statement of them:

* **Parameters are the constructor's keyword arguments**, stored unchanged under
  their own names by ``__init__`` and checked only when learning starts.
  :meth:`Estimator.get_params` reads them from the signature, so a subclass
  declares a parameter once; :meth:`Estimator.set_params` accepts ``step__name``
  for a parameter of a parameter.
* **Learned state is named with a trailing underscore** (``classes_``,
  ``n_features_in_``) or kept private; an estimator is fitted once fit has run.
  Methods that need a fitted estimator raise :class:`NotFittedError` before.
* **Input errors are ValueErrors with scikit-learn's wording**, because tools and
  users match on it: :func:`check_labels` for y, :func:`check_n_samples`.
* **Tags** (``__sklearn_tags__``) tell scikit-learn what an estimator takes. Only
  scikit-learn calls them, so they import it then and nowhere else: spamnb runs
  without scikit-learn installed.

Two names scikit-learn users catch, :class:`NotFittedError` and
:class:`DataConversionWarning`, are spamnb's own classes; while scikit-learn is
loaded in the process (and only then: it is never imported for this), what is
raised or warned is also an instance of scikit-learn's class of that name, so
``except sklearn.exceptions.NotFittedError`` catches it as well.
"""

from __future__ import annotations

import inspect
import sys
import warnings

import numpy as np

__all__ = [
    "Classifier",
    "DataConversionWarning",
    "Estimator",
    "NotFittedError",
    "Transformer",
    "check_labels",
    "check_n_samples",
    "not_fitted",
]


class NotFittedError(ValueError, AttributeError):
    """A method that needs a fitted estimator was called before ``fit``."""


class DataConversionWarning(UserWarning):
    """Input of another shape or type than expected was converted (a column vector y)."""


_BOTH: dict = {}


def _with_sklearns(cls):
    """``cls``, or while scikit-learn is loaded, a subclass of ``cls`` and of
    scikit-learn's class of the same name (made once per pair)."""
    theirs = getattr(sys.modules.get("sklearn.exceptions"), cls.__name__, None)
    if not isinstance(theirs, type) or issubclass(cls, theirs):
        return cls
    both = _BOTH.get((cls, theirs))
    if both is None:
        both = _BOTH[(cls, theirs)] = type(cls.__name__, (cls, theirs), {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            # pickled (a joblib worker's error) as spamnb's own class
            "__reduce__": lambda self: (cls, self.args),
        })
    return both


def not_fitted(estimator, method="this method"):
    """The :class:`NotFittedError` for calling ``method`` of an unfitted ``estimator``."""
    name = type(estimator).__name__
    return _with_sklearns(NotFittedError)(
        f"This {name} instance is not fitted yet; call 'fit' with appropriate arguments before {method}."
    )


def check_n_samples(X, y):
    """ValueError unless X and y hold as many samples."""
    if X.shape[0] != y.shape[0]:
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: [{X.shape[0]}, {y.shape[0]}]"
        )


def check_labels(y, who):
    """y as a 1-D array of class labels, or a ValueError in scikit-learn's words.

    A column vector (n, 1) is flattened with a :class:`DataConversionWarning`; numbers
    must be finite and, if floats, whole (a continuous target is not a set of classes).
    """
    if y is None:
        raise ValueError(f"{who} requires y to be passed, but the target y is None.")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        warnings.warn(
            _with_sklearns(DataConversionWarning)(
                "A column-vector y was passed when a 1d array was expected. Please change "
                "the shape of y to (n_samples, ), for example using ravel()."
            ),
            stacklevel=3,
        )
        y = y.ravel()
    elif y.ndim != 1:
        raise ValueError(f"y should be a 1d array, got an array of shape {y.shape} instead.")
    kind = y.dtype.kind
    if kind == "c":
        raise ValueError("Complex data not supported")
    if kind == "f" and y.size:
        bad = ~np.isfinite(y)
        if bad.any():
            what = "NaN" if np.isnan(y[bad]).any() else f"infinity or a value too large for {y.dtype!r}"
            raise ValueError(f"Input y contains {what}.")
        if (y != np.floor(y)).any():
            raise ValueError(
                "Unknown label type: continuous. Maybe you are trying to fit a classifier, which "
                "expects discrete classes on a regression target with continuous values."
            )
    return y


class Estimator:
    """Parameters from the constructor's signature, a readable repr, and the tags hook.

    A subclass's ``__init__`` takes keyword parameters only and stores each,
    unchanged, under its own name (no checks there: ``fit`` checks them, so
    ``set_params`` and ``clone`` can pass any value through).
    """

    @classmethod
    def _param_names(cls):
        params = []
        for p in inspect.signature(cls.__init__).parameters.values():
            if p.name == "self":
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"{cls.__name__}.__init__ must name its parameters (no *args/**kwargs)")
            params.append(p.name)
        return sorted(params)

    def get_params(self, deep=True):
        """The parameters by name; with ``deep``, a parameter's own as ``name__param`` too."""
        out = {}
        for name in self._param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{name}__{k}", v) for k, v in value.get_params().items())
            out[name] = value
        return out

    def set_params(self, **params):
        """Set parameters by name (``name__param``: a parameter of a parameter); returns self."""
        names = self._param_names()
        nested = {}
        for key, value in params.items():
            name, deep, sub = key.partition("__")
            if name not in names:
                raise ValueError(
                    f"Invalid parameter {name!r} for estimator {self!r}. Valid parameters are: {names!r}."
                )
            if deep:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, sub in nested.items():
            getattr(self, name).set_params(**sub)
        return self

    def __repr__(self):
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        shown = []
        for name, value in self.get_params(deep=False).items():
            default = defaults.get(name, inspect.Parameter.empty)
            same = value is default
            if not same and not isinstance(value, np.ndarray) and not isinstance(default, np.ndarray):
                try:
                    same = bool(value == default) and type(value) is type(default)
                except (TypeError, ValueError):
                    same = False
            if not same:
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def __sklearn_is_fitted__(self):
        return hasattr(self, "n_features_in_")

    def __sklearn_tags__(self):
        # called by scikit-learn only: importing it here costs nothing to anyone else
        from sklearn.utils import InputTags, Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False), input_tags=InputTags())


class Classifier(Estimator):
    """An estimator with ``predict`` and ``classes_``: accuracy as its ``score``."""

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of ``predict(X)`` against y (weighted by ``sample_weight``)."""
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y.ravel()
        pred = self.predict(X)
        check_n_samples(pred, y)
        return float(np.average(pred == y, weights=sample_weight))

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags

        tags = super().__sklearn_tags__()
        tags.estimator_type = "classifier"
        tags.classifier_tags = ClassifierTags()
        tags.target_tags.required = True
        return tags


class Transformer(Estimator):
    """An estimator with ``transform`` and ``fit_transform`` (the subclass writes both)."""

    def __sklearn_tags__(self):
        from sklearn.utils import TransformerTags

        tags = super().__sklearn_tags__()
        tags.transformer_tags = TransformerTags()
        return tags
