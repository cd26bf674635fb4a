"""recjit: a just-in-time compiler for recursive deep-learning models (docs/design.md)."""
from .autodiff import Gradients, RowGrad
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

__version__ = "0.1.0"


def __getattr__(name):
    """`rj.torch`, imported when first used: `import recjit` needs no PyTorch."""
    if name == "torch":
        import importlib
        try:
            return importlib.import_module(".torch", __name__)
        except ImportError as error:
            if error.name != "torch":
                raise
            raise ImportError("recjit.torch needs PyTorch: pip install 'recjit[torch]'",
                              name="torch") from None
    raise AttributeError(f"module 'recjit' has no attribute {name!r}")


__all__ = ["CacheWarning", "DeviceParams", "FallbackWarning", "Forest", "Gradients", "InputError",
           "NodeView", "Params", "RecJitError", "RecursionPropertyError", "RecursiveModel",
           "Result", "RowGrad", "Schedule", "ScheduleError", "ShapeError", "UnsupportedError",
           "concat", "exp", "log", "maximum", "minimum", "ones", "recursive_model", "relu", "sigmoid", "split", "sqrt",
           "tanh", "zeros"]
