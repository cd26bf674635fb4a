"""The tensor operations of the cell language, as NumPy functions.

They give the decorated function its plain-Python meaning (the reference semantics); the
frontend recognises them by identity and compiles them."""
import builtins
import contextlib
import threading

import numpy as np

from .params import is_weak

_filling = threading.local()  # the dtype rj.zeros and rj.ones make while a reference runs


def tanh(x):
    return _kept_weak(np.tanh(x), x)


def sigmoid(x):
    return _kept_weak(1.0 / (1.0 + np.exp(-x)), x)


def relu(x):
    return _kept_weak(np.maximum(x, 0), x)


def exp(x):
    return _kept_weak(np.exp(x), x)


def log(x):
    return _kept_weak(np.log(x), x)


def sqrt(x):
    return _kept_weak(np.sqrt(x), x)


def abs(x):
    return _kept_weak(np.abs(x), x)


def maximum(a, b):
    return _kept_weak(np.maximum(a, b), a, b)


def minimum(a, b):
    return _kept_weak(np.minimum(a, b), a, b)


def _kept_weak(result, *arguments):
    """A Python number where every argument is one. NumPy returns a float64 scalar, which
    would make a float32 model's arrays float64 where the kernel computes in float32: a
    Python number takes the arrays' dtype (`params.is_weak`), and so does what is computed
    from numbers alone. An array goes straight through: the reference is the bench's NumPy
    peer, and this is on its every operation."""
    if isinstance(result, np.ndarray):
        return result
    return float(result) if all(is_weak(argument) for argument in arguments) else result


def split(x, n):
    """Split a vector into `n` equal consecutive parts, or, as NumPy's `np.split`, at the
    indices in the list `n`."""
    if isinstance(n, int) and x.shape[0] % n:
        raise ValueError(f"cannot split a vector of length {x.shape[0]} into {n} equal parts")
    return tuple(np.split(x, n))


def concat(parts):
    return np.concatenate(parts)


def zeros(shape):
    return np.zeros(shape, dtype=getattr(_filling, "dtype", None))


def ones(shape):
    return np.ones(shape, dtype=getattr(_filling, "dtype", None))


@contextlib.contextmanager
def filling(dtype):
    """rj.zeros and rj.ones in `dtype` (NumPy's float64 elsewhere) while the reference runs a
    cell, so that a float32 model's recursion computes in float32, as its kernel does, rather
    than in float64 from its first `rj.zeros` on."""
    previous = getattr(_filling, "dtype", None)
    _filling.dtype = dtype
    try:
        yield
    finally:
        _filling.dtype = previous


UNARY = {tanh: "tanh", sigmoid: "sigmoid", relu: "relu", exp: "exp", log: "log", abs: "abs",
         sqrt: "sqrt"}
BINARY = {maximum: "maximum", minimum: "minimum"}

# NumPy's functions (and Python's `abs`) that a cell may call for rj's: the plain recursion
# runs them as written, and a float32 array stays float32 through each. (np.zeros and np.ones
# are not among them: they make float64 arrays, which would turn a float32 recursion into a
# float64 one.)
NUMPY = ((np.tanh, tanh), (np.exp, exp), (np.log, log), (np.maximum, maximum),
         (np.minimum, minimum), (np.concatenate, concat), (np.abs, abs), (builtins.abs, abs),
         (np.sqrt, sqrt), (np.split, split))

# NumPy's products, which a cell may write for `@`.
PRODUCTS = (np.dot, np.matmul)


def as_cell_function(function):
    """The rj function that NumPy's (or Python's) `function` stands for in a cell, else
    `function`."""
    for numpy_function, cell_function in NUMPY:
        if function is numpy_function:
            return cell_function
    return function
