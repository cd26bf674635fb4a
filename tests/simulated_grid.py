"""A grid of several blocks in numba's CUDA simulator.

The simulator runs a launch one block after another and takes a grid sync for a block sync, so
it runs a cooperative kernel of one block only; the fused kernels' partition of the weight
rows over blocks, their per-block weight slices and their grid barriers then go untested
without a GPU. Inside `concurrent_blocks()`, every block of a launch runs at once: a block's
threads meet at a barrier of their own, all the grid's threads at a grid sync, shared memory
is per block, and a warp's lanes exchange values by `cuda.shfl_down_sync`, which the
simulator lacks. With a `lag`, block b sleeps b · lag seconds after each block barrier, so
that blocks run apart wherever only a block barrier holds them together: a block that reads
what another block computed after such a barrier then reads it too early."""
import contextlib
import sys
import threading
import time
import traceback

import numpy as np
from numba.core import types
from numba.cuda.simulator import kernel as simulated_kernel, kernelapi
from numba.np import numpy_support

from recjit.codegen_cuda.runtime import ALL_LANES, WARP


class _GridThread(simulated_kernel.BlockThread):
    """A simulated thread whose block and grid syncs are barriers."""

    def __init__(self, f, manager, block_index, thread_index, debug, launch):
        super().__init__(f, manager, block_index, thread_index, debug)
        self.launch = launch
        self.block_barrier = launch.block_barrier(block_index)

    def syncthreads(self):
        self.block_barrier.wait()
        if self.launch.lag:
            time.sleep(self.launch.lag * self.blockIdx.x)

    def grid_sync(self):
        self.launch.grid_barrier.wait()

    def shuffle_down(self, value, delta):
        """The value of the lane `delta` above this one (this one's own past the warp's end),
        once every lane of the warp has given its own."""
        lane = self.thread_id % WARP
        barrier, slots = self.launch.warp(self.blockIdx, self.thread_id // WARP)
        slots[lane] = value
        barrier.wait()
        result = slots[lane + delta] if lane + delta < WARP else value
        barrier.wait()
        return result


class _Launch:
    """The threads of one launch and their barriers."""

    lag = 0.0

    def __init__(self, grid_dim, block_dim):
        self.blocks = int(np.prod(grid_dim))
        self.threads_per_block = int(np.prod(block_dim))
        self.grid_barrier = threading.Barrier(self.blocks * self.threads_per_block)
        self.block_barriers = {}
        self.warps = {}
        self.threads = []

    def block_barrier(self, block_index):
        return self.block_barriers.setdefault(tuple(block_index),
                                              threading.Barrier(self.threads_per_block))

    def warp(self, block_index, warp_index):
        """A warp's barrier (for the lanes it has: a block's last warp may have fewer than
        32) and the slots its lanes exchange values through."""
        lanes = min(WARP, self.threads_per_block - warp_index * WARP)
        return self.warps.setdefault((tuple(block_index), warp_index),
                                     (threading.Barrier(lanes), [None] * WARP))

    def join(self):
        """Wait for every thread; on a thread's exception, break the barriers (so that no
        thread waits for it forever) and raise it."""
        while True:
            failed = next((t for t in self.threads if t.exception), None)
            if failed:
                barriers = (self.grid_barrier, *self.block_barriers.values(),
                            *(barrier for barrier, _ in self.warps.values()))
                for barrier in barriers:
                    barrier.abort()
                raise failed.exception[0].with_traceback(failed.exception[1])
            if not any(thread.is_alive() for thread in self.threads):
                return
            time.sleep(0.001)


class _ConcurrentBlocks(simulated_kernel.BlockManager):
    """Starts a block's threads and returns; the launch's last block waits for all of them.
    The simulator asks for one manager per block, in order."""

    current = None

    def run(self, grid_point, *args):
        if _ConcurrentBlocks.current is None:
            _ConcurrentBlocks.current = _Launch(self._grid_dim, self._block_dim)
        launch = _ConcurrentBlocks.current
        for thread_index in np.ndindex(*self._block_dim):
            thread = _GridThread(lambda: self._f(*args), self, grid_point, thread_index,
                                 self._debug, launch)
            launch.threads.append(thread)
            thread.start()
        if tuple(grid_point) == tuple(d - 1 for d in self._grid_dim):
            _ConcurrentBlocks.current = None
            launch.join()


def _grid_sync(self):
    threading.current_thread().grid_sync()


_swaps = {}  # id(a module's globals): (threads inside, the names it had for numba.cuda)
_swaps_lock = threading.Lock()


@contextlib.contextmanager
def _swapped_cuda_module(function, fake_cuda_module):
    """The simulator's `swapped_cuda_module`, which points a function's `cuda` at the
    launch's fake module while it runs, made safe for threads inside at once: the first to
    enter swaps, the last to leave swaps back. (The simulator's own swaps back when any thread
    leaves, under the feet of the threads still waiting at a barrier inside.)"""
    from numba import cuda
    names = function.__globals__
    with _swaps_lock:
        inside, original = _swaps.get(id(names), (0, None))
        if not inside:
            original = {name: value for name, value in names.items() if value is cuda}
            names.update(dict.fromkeys(original, fake_cuda_module))
        _swaps[id(names)] = (inside + 1, original)
    try:
        yield
    finally:
        with _swaps_lock:
            inside, original = _swaps.pop(id(names))
            if inside == 1:
                names.update(original)
            else:
                _swaps[id(names)] = (inside - 1, original)


def _shfl_down_sync(self, mask, value, delta):
    if mask != ALL_LANES:
        raise NotImplementedError("the simulated grid shuffles whole warps only")
    return threading.current_thread().shuffle_down(value, delta)


def _shared_array_per_block(self, shape, dtype):
    """The simulator's shared arrays, told apart by block as well as by source line."""
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    caller = tuple(traceback.extract_stack(sys._getframe())[-2][0:2])
    key = (caller, tuple(threading.current_thread().blockIdx))
    return self._allocations.setdefault(key, np.empty(shape, dtype))


@contextlib.contextmanager
def concurrent_blocks(lag=0.0):
    patches = [(_Launch, "lag", lag),
               (simulated_kernel, "BlockManager", _ConcurrentBlocks),
               (simulated_kernel, "swapped_cuda_module", _swapped_cuda_module),
               (kernelapi.GridGroup, "sync", _grid_sync),
               (kernelapi.FakeCUDAModule, "shfl_down_sync", _shfl_down_sync),
               (kernelapi.FakeCUDAShared, "array", _shared_array_per_block)]
    saved = [(owner, name, vars(owner).get(name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        _ConcurrentBlocks.current = None
        for owner, name, value in saved:
            if value is None:  # the simulator has none of its own
                delattr(owner, name)
            else:
                setattr(owner, name, value)
