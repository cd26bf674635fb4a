"""What the CUDA backend asks of numba.cuda: the one place that tells numba's simulator
(`NUMBA_ENABLE_CUDASIM=1`, which runs a cooperative grid of one block) from a GPU."""
import numpy as np
from numba import cuda
from numba.core import config
from numba.cuda.cudadrv import driver
from numba.cuda.cudadrv.devicearray import is_cuda_ndarray

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


def cooperative_blocks(dispatcher, arguments, threads):
    """How many blocks of the compiled kernel can be co-resident, the most a cooperative
    launch may have."""
    if simulated():
        return 1
    argument_types = tuple(dispatcher.typeof_pyval(a) for a in arguments)
    return dispatcher.compile(argument_types).max_cooperative_grid_blocks(threads)


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


def pinned_array(shape, dtype):
    """Page-locked host memory: the device copies from it directly."""
    return cuda.pinned_array(shape, dtype=dtype)
