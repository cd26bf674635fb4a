"""What the CUDA backend asks of numba.cuda: the one place that tells numba's simulator
(`NUMBA_ENABLE_CUDASIM=1`, which runs a cooperative grid of one block) from a GPU."""
import ctypes

import numpy as np
from numba import cuda
from numba.core import config
from numba.core import types as numba_types
from numba.cuda.cudadrv import driver
from numba.cuda.cudadrv.devicearray import is_cuda_ndarray

try:
    from cuda.core import LaunchConfig
    from cuda.core import launch as core_launch
    from numba.cuda._compat import CUDA_CORE_GE_1_0
    _COOPERATIVE = "is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch"
except ImportError:  # numba's simulator without cuda-python: CooperativeLaunch defers to numba
    LaunchConfig = core_launch = _COOPERATIVE = None

from ..errors import InputError, RecJitError
from ..schedule import MAX_THREADS

# Static shared memory a block may hold without opting in to more.
SHARED_BYTES = 48 * 1024


def simulated():
    return bool(config.ENABLE_CUDASIM)


def require_device():
    if not simulated() and not cuda.is_available():
        raise RecJitError("backend='cuda' needs an NVIDIA GPU and its driver (numba.cuda finds "
                          "none here); NUMBA_ENABLE_CUDASIM=1 runs the same kernels in "
                          "numba's simulator, slowly")


def threads_per_block():
    """The default threads a block. On an H100, 512 (16 warps to hide the products' load
    latency, at 128 registers a thread) ran batches of 10 SST trees 10-25% faster than 256,
    and single trees as fast (benchmarks/README.md). Each simulated thread is a Python
    thread: a warp's worth is plenty there."""
    return 32 if simulated() else MAX_THREADS


def launch_bound(threads):
    """The launch bound a kernel of `threads` threads a block is compiled with; the
    simulator's `cuda.jit` takes none."""
    return None if simulated() else threads


def multiprocessors():
    return 1 if simulated() else cuda.get_current_device().MULTIPROCESSOR_COUNT


class CooperativeLaunch:
    """A fused kernel's cooperative launch, its arguments flattened here rather than by
    numba-cuda. numba-cuda's launch path types every argument and flattens each device array
    into meminfo, parent, size, itemsize, pointer, shape and strides in Python at every call,
    about 0.1 ms for ~25 arguments (H100, numba-cuda 0.30.4). A run's arrays are the same
    objects from run to run (buffers.py keeps them), so each one's flattened form is kept,
    keyed by the array. Arguments of other types than the first launch's, and the simulator,
    go through numba's own launch."""

    KEPT_ARRAYS = 128

    def __init__(self, dispatcher, arguments, threads):
        self.dispatcher = dispatcher
        self.threads = threads
        self.classes = tuple(type(a) for a in arguments)
        self.flattened = {}
        self.fast = False
        if simulated():
            return
        self.types = tuple(dispatcher.typeof_pyval(a) for a in arguments)
        self.compiled = dispatcher.compile(self.types)
        self.configs = {}
        self.fast = (LaunchConfig is not None
                     and all(isinstance(t, (numba_types.Array, numba_types.Integer))
                             for t in self.types))
        if self.fast:
            # numba-cuda internals (0.30): a release without them launches through numba.
            try:
                self.function = self.compiled._codelibrary.get_cufunc().kernel
                self.stream = driver._to_core_stream(0)  # the default stream, as numba's
            except AttributeError:
                self.fast = False

    def max_blocks(self):
        """How many blocks of the kernel can be co-resident, the most a cooperative launch
        may have."""
        if simulated():
            return 1
        return self.compiled.max_cooperative_grid_blocks(self.threads)

    def __call__(self, blocks, arguments):
        values = self._flatten(arguments)
        if values is None:
            self.dispatcher[blocks, self.threads](*arguments)
            return
        if blocks not in self.configs:
            self.configs[blocks] = LaunchConfig(grid=(blocks, 1, 1), block=(self.threads, 1, 1),
                                                shmem_size=0, **{_COOPERATIVE: True})
        core_launch(self.stream, self.configs[blocks], self.function, *values)

    def _flatten(self, arguments):
        """The kernel's parameter values, or None where numba must launch it."""
        if not self.fast or tuple(type(a) for a in arguments) != self.classes:
            return None
        values = []
        for argument_type, argument in zip(self.types, arguments):
            if isinstance(argument_type, numba_types.Integer):
                values.append(getattr(ctypes, f"c_{argument_type}")(argument))
                continue
            flat = self._flat_array(argument_type, argument)
            if flat is None:
                return None
            values.extend(flat)
        return values

    def _flat_array(self, argument_type, array):
        """The array as the kernel's parameters see it, or None if it is not of the type
        the kernel was compiled for."""
        kept = self.flattened.get(id(array))
        if kept is not None and kept[0] is array:
            return kept[1]
        if self.dispatcher.typeof_pyval(array) != argument_type or not array.is_c_contiguous():
            return None
        itemsize = array.dtype.itemsize
        strides = [itemsize * int(np.prod(array.shape[axis + 1:], dtype=np.int64))
                   for axis in range(array.ndim)]
        flat = (0, 0, array.size, itemsize, array.device_ctypes_pointer.value or 0,
                *array.shape, *strides)
        if len(self.flattened) >= self.KEPT_ARRAYS:
            self.flattened.clear()
        self.flattened[id(array)] = (array, flat)
        return flat


def to_device(what, value, dtype):
    """`value` on the device with `dtype`: a numba device array or an object exposing
    `__cuda_array_interface__` (CuPy, PyTorch CUDA tensors) as it is, anything else copied
    from the host. `what` names it in errors."""
    if is_cuda_ndarray(value) or hasattr(value, "__cuda_array_interface__"):
        if not is_cuda_ndarray(value):
            if simulated():
                raise InputError(f"{what} is a GPU array (it has __cuda_array_interface__); "
                                 "numba's simulator takes NumPy arrays only")
            value = cuda.as_cuda_array(value)
        if np.dtype(value.dtype) != np.dtype(dtype):
            raise InputError(f"{what} is a {np.dtype(value.dtype)} array on the device; the "
                             f"kernel computes in {np.dtype(dtype)}: convert it first")
        if not value.is_c_contiguous():
            raise InputError(f"{what} is not C-contiguous on the device")
        return value
    return cuda.to_device(np.ascontiguousarray(value, dtype=dtype))


def device_array(shape, dtype):
    return cuda.device_array(shape, dtype=dtype)


def copy_bytes_to_device(on_device, on_host):
    """Copy a host buffer to a device buffer of as many bytes. On a GPU through the driver
    binding: `DeviceNDArray.copy_to_device` spends 0.1-0.15 ms checking and viewing its
    arguments in Python, the driver call 0.02 ms (H100, numba-cuda 0.30.4, 4 KiB)."""
    if simulated():
        on_device.copy_to_device(on_host)
    else:
        driver.host_to_device(on_device, on_host, on_host.nbytes)


def copy_bytes_to_host(on_host, on_device, nbytes):
    """Copy the first `nbytes` bytes of a device buffer to a host buffer. On a GPU through
    the driver binding, one synchronous copy: `copy_to_host` spends 0.03-0.1 ms of Python a
    call, and a view of the bytes as much again (H100, numba-cuda 0.30.4)."""
    if simulated():
        on_host[:nbytes] = on_device.copy_to_host()[:nbytes]
    elif nbytes:
        driver.device_to_host(on_host, on_device, nbytes)


def pinned_array(shape, dtype):
    """Page-locked host memory: the device copies from it directly."""
    return cuda.pinned_array(shape, dtype=dtype)
