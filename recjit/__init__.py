"""recjit: a just-in-time compiler for recursive deep-learning models (docs/design.md)."""
import os as _os

# Before numba's OpenMP threads start: they spin 1,000 times at a barrier before they sleep, not
# GNU OpenMP's default 300,000, which on a machine shared with other processes held the cores
# those needed (docs/threads.md). A value already set is kept.
_os.environ.setdefault("GOMP_SPINCOUNT", "1000")

from .autodiff import Gradients, RowGrad  # noqa: E402
from .errors import (CacheWarning, FallbackWarning, InputError, RecJitError, RecursionPropertyError,
                     ScheduleError, ShapeError, UnsupportedError)
from .linearize import Forest
from .model import RecursiveModel, recursive_model
from .ops import abs as abs  # rj.abs; not in __all__, so `import *` keeps Python's abs
from .ops import (concat, exp, log, maximum, minimum, ones, relu, sigmoid, split, sqrt, tanh,
                  zeros)
from .params import DeviceParams, Params
from .reference import NodeView
from .result import Result
from .schedule import Schedule
from .threads import get_num_threads, set_num_threads

__version__ = "0.1.0"


_EXTRAS = {"torch": ("PyTorch", ("torch",)), "dask": ("Dask", ("dask", "cloudpickle"))}


def __getattr__(name):
    """`rj.torch`, `rj.dask`, imported when first used: `import recjit` needs neither."""
    if name in _EXTRAS:
        import importlib
        needs, packages = _EXTRAS[name]
        try:
            return importlib.import_module(f".{name}", __name__)
        except ImportError as error:
            if error.name not in packages:
                raise
            raise ImportError(f"recjit.{name} needs {needs}: pip install 'recjit[{name}]'",
                              name=error.name) from None
    raise AttributeError(f"module 'recjit' has no attribute {name!r}")


def __dir__():
    """The public names (what a notebook's completion offers), the extras among them, not
    the pipeline's stage packages."""
    return sorted([*__all__, "abs", "__version__", *_EXTRAS])


__all__ = ["CacheWarning", "DeviceParams", "FallbackWarning", "Forest", "Gradients", "InputError",
           "NodeView", "Params", "RecJitError", "RecursionPropertyError", "RecursiveModel",
           "Result", "RowGrad", "Schedule", "ScheduleError", "ShapeError", "UnsupportedError",
           "concat", "exp", "get_num_threads", "log", "maximum", "minimum", "ones",
           "recursive_model", "relu", "set_num_threads", "sigmoid", "split", "sqrt", "tanh",
           "zeros"]
