"""Parameters: any object whose attributes are arrays, or Python numbers (weak scalars, as in
NumPy: they take the dtype of the arrays). `Params` is the convenient one."""
from types import SimpleNamespace

import numpy as np

from .errors import InputError


class Params:
    """A named bundle of parameter arrays (and Python numbers, kept as they are), passed
    unchanged to every recursive call."""

    def __init__(self, *positional, **arrays):
        _check_names(type(self).__name__, positional, arrays)
        for name, value in arrays.items():
            setattr(self, name, value if is_weak(value) else parameter_array(name, value))

    def names(self):
        return sorted(vars(self))

    def to_device(self):
        """These parameters copied once into GPU memory, for `backend="cuda"` runs to use
        without a copy per run."""
        from .codegen_cuda.device import require_device, to_device
        require_device(f"{type(self).__name__}.to_device()")
        arrays = vars(self)
        dtypes = {value.dtype for value in arrays.values() if not is_weak(value)}
        number_dtype = dtypes.pop() if len(dtypes) == 1 else np.float64
        return DeviceParams(**{
            name: to_device(f"parameter {name!r}", value,
                            number_dtype if is_weak(value) else value.dtype)
            for name, value in arrays.items()})

    def __repr__(self):
        shapes = ", ".join(f"{k}={shape_and_dtype(getattr(self, k))[0]}" for k in self.names())
        return f"{type(self).__name__}({shapes})"


class DeviceParams(Params):
    """Parameters in GPU memory (`Params.to_device()`): numba device arrays, or any arrays
    exposing `__cuda_array_interface__` (CuPy, PyTorch CUDA tensors), kept as they are."""

    # Not Params.__init__, which would copy the arrays to the host.
    def __init__(self, *positional, **arrays):  # noqa: PLW0231
        _check_names(type(self).__name__, positional, arrays)
        for name, value in arrays.items():
            setattr(self, name, value)


def parameter_array(name, value):
    """A parameter as a NumPy array; a value NumPy makes none of (a ragged nest of lists) is
    refused naming it."""
    check_as_array(f"parameter {name!r}", value)
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as error:
        raise InputError(f"parameter {name!r} is not an array: {error}") from None


def _check_names(kind, positional, arrays):
    """Parameters come by name; a name may not hide one of `Params`' methods."""
    if positional:
        raise InputError(f"{kind} takes its parameters by name, {kind}(W=..., b=...); for a "
                         f"dict of them, {kind}(**params)")
    for name in arrays:
        if hasattr(Params, name):
            raise InputError(f"a parameter may not be named {name!r}, an attribute "
                             f"{kind} has of its own; rename it in the cell and here")


def is_weak(value):
    """A Python int or float. As in NumPy, it takes the dtype of the arrays it meets, so
    `Params(W=float32_array, alpha=0.1)` is a float32 model."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def on_device(value):
    """Whether `value` lives in GPU memory: a numba device array (or its simulator's), or any
    object exposing `__cuda_array_interface__` (CuPy arrays, PyTorch CUDA tensors)."""
    return not isinstance(value, np.ndarray) and (
        hasattr(value, "copy_to_host") or hasattr(value, "__cuda_array_interface__"))


def to_host(value):
    """`value` on the host: a GPU array's values copied into a NumPy array, anything else as
    it is."""
    if not on_device(value):
        return value
    if not hasattr(value, "copy_to_host"):
        from numba import cuda
        value = cuda.as_cuda_array(value)
    return value.copy_to_host()


def check_as_array(what, value, differentiated=("call the model through rj.torch.apply or "
                                                "rj.torch.Module")):
    """Refuse a value whose array is not what its user means, or cannot be taken: a PyTorch
    tensor that requires grad (recjit's own calls read its values, and would drop its
    graph; `differentiated`: how to keep it), and a NumPy masked array with masked elements
    (a kernel reads every element, the masked ones too, where NumPy would leave them out).
    A plain NumPy array, the common case of every call, is neither."""
    if type(value) is np.ndarray:
        return
    if getattr(value, "requires_grad", False) is True:
        raise InputError(f"{what} is a PyTorch tensor that requires grad; recjit's own calls "
                         "take its values, not its graph: pass `.detach()`, or "
                         f"{differentiated} to differentiate through it")
    if isinstance(value, np.ma.MaskedArray) and np.ma.getmaskarray(value).any():
        raise InputError(f"{what} is a masked array with masked elements; recjit reads "
                         "every element, masked or not: pass `.filled(value)` with the value "
                         "they stand for")


def params_on_host(p, names):
    """`p`, or where any of its `names` is a GPU array, `Params` of host copies of them."""
    values = {name: getattr(p, name, None) for name in names}
    if not any(on_device(value) for value in values.values()):
        return p
    return Params(**{name: to_host(value) for name, value in values.items()
                     if value is not None})


def shape_and_dtype(value):
    """A parameter's shape and dtype, without copying a device array to the host."""
    if isinstance(value, np.ndarray):
        return value.shape, value.dtype
    if hasattr(value, "copy_to_host"):  # numba builds its interface anew at every read
        return tuple(value.shape), value.dtype
    if hasattr(value, "__cuda_array_interface__"):
        interface = value.__cuda_array_interface__
        return tuple(interface["shape"]), np.dtype(interface["typestr"])
    value = np.asarray(value)
    return value.shape, value.dtype


def context_tuple(context):
    """`context=` as a tuple; anything but a tuple or list is refused (a number alone, as for
    a cell of one context argument, is not iterable; an array would be taken apart)."""
    if not isinstance(context, (tuple, list)):
        raise InputError(f"context= takes the cell's arguments after p as a tuple, "
                         f"context=(value,) for one, not a {type(context).__name__}")
    return tuple(context)


class WithContext:
    """The parameters and a cell's context arguments under one set of names: the compiler
    reads a context argument as a parameter that every recursive call passes on unchanged."""

    def __init__(self, params, context):
        for name in context:
            if getattr(params, name, None) is not None:
                raise InputError(f"context argument {name!r} has the name of a parameter; "
                                 "rename one of them")
        self._params = params
        self._context = dict(context)

    def names_context(self, name):
        return name in self.__dict__["_context"]

    def __getattr__(self, name):
        context = self.__dict__["_context"]
        if name in context:
            return context[name]
        return getattr(self.__dict__["_params"], name)


def pinned(params, names, copied=()):
    """`params`' `names` as they are now: what a pullback reads, so that its gradients stay at
    the values the forward read. Those in `copied` are copies taken now, which no later
    change reaches; the others are held by reference, so that setting an attribute of the
    caller's object to another array after `vjp` (`p.W = p.W - lr * g`) leaves them as they
    were, and a change made to them in place is refused (`autodiff.pullback.parameter_guards`)."""
    if isinstance(params, WithContext):
        context = params.__dict__["_context"]
        return WithContext(
            pinned(params.__dict__["_params"], [name for name in names if name not in context],
                   copied),
            {name: value.copy() if name in copied else value for name, value in context.items()})
    return SimpleNamespace(**{name: getattr(params, name).copy() if name in copied
                              else getattr(params, name) for name in names
                              if getattr(params, name, None) is not None})


def described(params, name):
    """How an error names `name` of `params`: a context argument or a parameter."""
    if isinstance(params, WithContext) and params.names_context(name):
        return f"context argument {name!r}"
    return f"parameter {name!r}"
