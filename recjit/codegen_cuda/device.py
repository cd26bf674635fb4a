"""What the CUDA backend asks of numba.cuda: the one place that tells numba's simulator
(`NUMBA_ENABLE_CUDASIM=1`, which runs a cooperative grid of one block) from a GPU."""
import contextlib
import ctypes
import math
import operator

import numpy as np
from numba import cuda
from numba.core import config
from numba.core import types as numba_types
from numba.np import numpy_support
from numba.cuda.cudadrv import driver
from numba.cuda.cudadrv.devicearray import is_cuda_ndarray

from ..errors import InputError, RecJitError
from ..schedule import MAX_THREADS

# Static shared memory a block may hold without opting in to more.
SHARED_BYTES = 48 * 1024


def simulated():
    return bool(config.ENABLE_CUDASIM)


class GpuMath:
    """The `math` a generated kernel reads in the simulator, which runs it as Python: a GPU's
    results where Python's raise (`exp` overflowing to inf, `log` of 0 and of a negative number
    to -inf and NaN, `sqrt` of a negative number to NaN), so that the simulator computes what
    the GPU does."""

    tanh = staticmethod(math.tanh)

    @staticmethod
    def exp(x):
        try:
            return math.exp(x)
        except OverflowError:
            return math.inf

    @staticmethod
    def log(x):
        try:
            return math.log(x)
        except ValueError:
            return -math.inf if x == 0 else math.nan

    @staticmethod
    def sqrt(x):
        return math.sqrt(x) if x >= 0 else math.nan


def require_device(what="backend='cuda'"):
    """Refuse `what` (a backend, a copy to the device) where there is no GPU to run it on."""
    if not simulated() and not cuda.is_available():
        raise RecJitError(f"{what} needs an NVIDIA GPU and its driver (numba.cuda finds none "
                          "here); NUMBA_ENABLE_CUDASIM=1 runs the same kernels in numba's "
                          "simulator, slowly")


def threads_per_block():
    """The default threads a block. On an H100, 512 (16 warps to hide the products' load
    latency, at 128 registers a thread) ran batches of trees faster than 256, and single
    trees as fast (benchmarks/README.md). Each simulated thread is a Python
    thread: a warp's worth is plenty there."""
    return 32 if simulated() else MAX_THREADS


def launch_bound(threads):
    """The launch bound a kernel of `threads` threads a block is compiled with; the
    simulator's `cuda.jit` takes none."""
    return None if simulated() else threads


def multiprocessors():
    return 1 if simulated() else cuda.get_current_device().MULTIPROCESSOR_COUNT


def no_cooperative_launch():
    """Why this device cannot launch a fused kernel (a cooperative launch: a grid whose
    blocks meet at `grid.sync()`), or None if it can. GPUs before Pascal cannot, nor some
    virtualized ones; the simulator can."""
    if simulated() or cuda.get_current_device().COOPERATIVE_LAUNCH:
        return None
    return "this GPU does not support cooperative launches"


class CooperativeLaunch:
    """A fused kernel's cooperative launch, made through the driver's
    `cuLaunchCooperativeKernel` with parameters recjit lays out itself. numba-cuda's launch
    types every argument and flattens each device array into meminfo, parent, size,
    itemsize, pointer, shape and strides in Python at every call, and `cuda.core`'s launch
    then converts each of ~150 values (numba-cuda 0.30.4). A run's arrays are the same
    objects from run to run (buffers.py keeps them), so the parameters of each set of arrays
    are laid out once in a C buffer (`ParameterBuffer`); a launch writes the scalars into it
    and calls the driver.
    Arguments of other types than the first launch's, and the simulator, go through
    numba's own launch."""

    KEPT_LAYOUTS = 32

    def __init__(self, dispatcher, arguments, threads):
        self.dispatcher = dispatcher
        self.threads = threads
        self.classes = tuple(type(a) for a in arguments)
        self.layouts = {}  # {the arrays' ids: (the arrays, their ParameterBuffer)}
        self.fast = False
        if simulated():
            return
        self.types = tuple(dispatcher.typeof_pyval(a) for a in arguments)
        self.compiled = dispatcher.compile(self.types)
        self.array_positions = [i for i, t in enumerate(self.types)
                                if isinstance(t, numba_types.Array)]
        self.scalar_positions = [i for i, t in enumerate(self.types)
                                 if isinstance(t, numba_types.Integer)]
        self.fast = (len(self.array_positions) + len(self.scalar_positions) == len(self.types)
                     and all(self.types[i].bitwidth == 64 for i in self.scalar_positions))
        if self.fast:
            # numba-cuda internals (0.30): a release without them launches through numba.
            try:
                self.function = _driver_function(self.compiled._codelibrary.get_cufunc())
                self.stream = launch_stream()
            except (AttributeError, OSError, RecJitError):
                self.fast = False

    def max_blocks(self):
        """How many blocks of the kernel can be co-resident, the most a cooperative launch
        may have."""
        if simulated():
            return 1
        return self.compiled.max_cooperative_grid_blocks(self.threads)

    def __call__(self, blocks, arguments):
        parameters = self._parameters(arguments)
        if parameters is None:
            self.dispatcher[int(blocks), self.threads](*arguments)
            return
        driver_launch(self.function, blocks, self.threads, self.stream, parameters)

    def _parameters(self, arguments):
        """The launch's ParameterBuffer with these arguments' scalars written in, or None
        where numba must launch it."""
        if not self.fast or tuple(type(a) for a in arguments) != self.classes:
            return None
        arrays = tuple(arguments[i] for i in self.array_positions)
        key = tuple(map(id, arrays))
        kept = self.layouts.get(key)
        if kept is None or not all(map(operator.is_, kept[0], arrays)):
            parameters = self._lay_out(arguments)
            if parameters is None:
                return None
            if len(self.layouts) >= self.KEPT_LAYOUTS:
                self.layouts.clear()
            kept = self.layouts[key] = (arrays, parameters)
        parameters = kept[1]
        for slot, position in zip(parameters.scalar_slots, self.scalar_positions):
            parameters.values[slot] = arguments[position] % _TWO_TO_64
        return parameters

    def _lay_out(self, arguments):
        """The arguments flattened as the kernel's parameters are, or None if an array is
        not of the type the kernel was compiled for."""
        values, scalar_slots = [], []
        for argument_type, argument in zip(self.types, arguments):
            if isinstance(argument_type, numba_types.Integer):
                scalar_slots.append(len(values))
                values.append(0)
                continue
            if not typed_as(argument, argument_type):
                return None
            itemsize = argument.dtype.itemsize
            values += [0, 0, argument.size, itemsize, argument.device_ctypes_pointer.value or 0,
                       *argument.shape, *c_strides(argument.shape, itemsize)]
        return ParameterBuffer(values, scalar_slots)


def typed_as(array, array_type):
    """Whether numba would type device array `array` as `array_type` for a launch, for the
    C-contiguous array types recjit's kernels take: what `typeof` decides (layout 'C' for a
    C-contiguous array without a zero stride), without building the type: a vjp's arrays are
    new at every step, so this runs for each of them at each launch."""
    return (isinstance(array_type, numba_types.Array) and array_type.layout == "C"
            and array_type.mutable and array_type.aligned and array.ndim == array_type.ndim
            and array.dtype == numpy_support.as_dtype(array_type.dtype)
            and array.is_c_contiguous() and not (array.size and 0 in array.strides))


def c_strides(shape, itemsize):
    """The byte strides of a C-contiguous array of `shape`: what numba passes a kernel for
    one."""
    strides, stride = [], itemsize
    for extent in reversed(shape):
        strides.append(stride)
        stride *= extent
    return strides[::-1]


class ParameterBuffer:
    """A launch's parameters, each in an 8-byte slot of one C buffer, and the array of
    pointers to the slots that the driver reads (its `kernelParams`)."""

    def __init__(self, values, scalar_slots):
        self.values = (ctypes.c_uint64 * len(values))(*(v % _TWO_TO_64 for v in values))
        base = ctypes.addressof(self.values)
        self.pointers = (ctypes.c_void_p * len(values))(*range(base, base + 8 * len(values), 8))
        self.scalar_slots = scalar_slots


_TWO_TO_64 = 1 << 64
_libcuda = None


def _driver():
    """The CUDA driver library, through ctypes, with the signatures recjit calls."""
    global _libcuda
    if _libcuda is None:
        library = ctypes.CDLL("libcuda.so.1")
        library.cuLaunchCooperativeKernel.argtypes = (
            [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p])
        library.cuKernelGetFunction.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        library.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.c_void_p]
        library.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p,
                                                 ctypes.c_size_t, ctypes.c_void_p]
        library.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        _libcuda = library
    return _libcuda


def launch_stream():
    """The handle of numba's default stream, on which recjit queues its launches and its
    uploads (numba-cuda internals, 0.30: AttributeError without them)."""
    return int(driver._to_core_stream(0).handle)


def _check(result, call):
    if result != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(name))
        raise RecJitError(f"CUDA driver: {call} failed with "
                          f"{(name.value or b'error %d' % result).decode()}")


def _driver_function(cufunc):
    """The CUfunction of a kernel numba-cuda loaded: `cuda.core` holds a library's CUkernel,
    which the driver resolves to the current context's function."""
    handle = cufunc.kernel.handle
    if type(handle).__name__ == "CUfunction":
        return int(handle)
    function = ctypes.c_void_p()
    _check(_driver().cuKernelGetFunction(ctypes.byref(function), ctypes.c_void_p(int(handle))),
           "cuKernelGetFunction")
    return function.value


def driver_launch(function, blocks, threads, stream, parameters):
    """One cooperative launch of `blocks` blocks of `threads` threads."""
    _check(_driver().cuLaunchCooperativeKernel(function, blocks, 1, 1, threads, 1, 1, 0, stream,
                                               parameters.pointers),
           "cuLaunchCooperativeKernel")


def packed_view(buffer, begin, end, dtype, shape):
    """Bytes [begin, end) of `buffer`, a byte device array, as a C-contiguous array of
    `dtype` and `shape`. On a GPU it is made at once on the buffer's memory, as numba-cuda's
    slice makes one: its slice, `view` and `reshape` would make three device arrays, each
    costing tens of microseconds, and a pullback makes a view for each of ~20 arrays every
    step (`PackedArrays`)."""
    if simulated():
        return buffer[begin:end].view(dtype).reshape(shape)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray  # the simulator has none
    dtype = np.dtype(dtype)
    return DeviceNDArray(shape, c_strides(shape, dtype.itemsize), dtype,
                         gpu_data=buffer.gpu_data.view(begin, end))


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
    return cuda.to_device(np.ascontiguousarray(value, dtype=dtype).reshape(np.shape(value)))


def grid_stride(items, threads=256):
    """(blocks, threads) for a grid-stride loop over `items` work items, at least one: a few
    blocks a multiprocessor at most."""
    return max(1, int(min(-(-items // threads), 4 * multiprocessors()))), threads


def device_array(shape, dtype):
    return cuda.device_array(shape, dtype=dtype)


class Copies:
    """Copies between a pinned host buffer and a device buffer of as many bytes, through the
    driver (ctypes) on the launches' stream, both buffers' addresses and the stream looked up
    once: `DeviceNDArray.copy_to_device` and `copy_to_host` spend much of a small run
    checking and viewing their arguments in Python, and numba's `driver.device_to_host`
    converts both pointers through `cuda.core` at every call (numba-cuda 0.30.4). In
    the simulator, or where numba-cuda's internals or libcuda are not as recjit knows them,
    numba copies."""

    def __init__(self, on_host, on_device):
        self.on_host = on_host
        self.on_device = on_device
        self.driver = None  # (libcuda, host address, device address, stream handle)
        if simulated():
            return
        with contextlib.suppress(AttributeError, OSError):
            self.driver = (_driver(), on_host.ctypes.data,
                           on_device.device_ctypes_pointer.value, launch_stream())

    def queue_to_device(self):
        """Queue the copy of the whole host buffer to the device, and return: the kernel
        launched next waits for it, the host does not. The host buffer must stay as it is
        until the stream has run the copy (`synchronize`)."""
        if self.driver is None:
            if simulated():
                self.on_device.copy_to_device(self.on_host)
            else:
                driver.host_to_device(self.on_device, self.on_host, self.on_host.nbytes)
            return
        library, host, on_device, stream = self.driver
        _check(library.cuMemcpyHtoDAsync_v2(on_device, host, self.on_host.nbytes, stream),
               "cuMemcpyHtoDAsync")

    def to_host(self, begin, nbytes):
        """Copy bytes [begin, begin + nbytes) of the device buffer to the host buffer's same
        bytes: one synchronous copy, after the launches queued on the stream."""
        if not nbytes:
            return
        if self.driver is None:
            if simulated():
                self.on_host[begin:begin + nbytes] = \
                    self.on_device[begin:begin + nbytes].copy_to_host()
            else:
                driver.device_to_host(self.on_host[begin:], self.on_device[begin:], nbytes)
            return
        library, host, on_device, _ = self.driver
        _check(library.cuMemcpyDtoH_v2(host + begin, on_device + begin, nbytes), "cuMemcpyDtoH")


def synchronize():
    """Wait until the device has run everything queued."""
    cuda.synchronize()


def pinned_array(shape, dtype):
    """Page-locked host memory: the device copies from it directly."""
    return cuda.pinned_array(shape, dtype=dtype)
