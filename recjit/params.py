"""Parameters: any object whose attributes are arrays. `Params` is the convenient one."""
import numpy as np


class Params:
    """A named bundle of parameter arrays, passed unchanged to every recursive call."""

    def __init__(self, **arrays):
        for name, value in arrays.items():
            setattr(self, name, np.asarray(value))

    def names(self):
        return sorted(vars(self))

    def __repr__(self):
        shapes = ", ".join(f"{k}={getattr(self, k).shape}" for k in self.names())
        return f"Params({shapes})"
