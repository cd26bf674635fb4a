"""Calling the CPU backend's numba parallel functions (the kernels, the backward's weight
products): one at a time in a process, and in a process forked after they ran.

Numba runs a parallel function on GNU OpenMP's threads here, and in a process forked from one
whose threads have started, numba kills the process at its next parallel call ("fork() called
from a process already using GNU OpenMP"): `multiprocessing`'s default on Linux, and every
DataLoader worker. There, a `Launcher` calls the same function compiled without `parallel`,
on the one thread the child has (docs/threads.md)."""
import os
import threading

import numba

from ..generated import compiling

# One parallel call at a time in this process: each already uses every core, and numba's
# workqueue threading layer (the one always present) aborts on concurrent parallel launches.
_running = threading.Lock()
# The process whose parallel calls started numba's threads; a child forked later inherits it.
_threads_started_in = None


def _after_fork_in_child():
    global _running
    _running = threading.Lock()  # a parent thread might have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_after_threads_started():
    """True in a process forked from one whose parallel calls started GNU OpenMP's threads."""
    return (_threads_started_in is not None and _threads_started_in != os.getpid()
            and numba.threading_layer() == "omp")


class Launcher:
    """`launch(*arguments)` calls `function(workers, *arguments)`, a numba parallel function
    whose first argument is the thread count, with numba's count; in a process forked after
    the threads started, its serial twin with one worker. Its first call, which compiles the
    function or loads it from numba's disk cache, holds the machine-wide lock `name`
    (`generated.compiling`)."""

    def __init__(self, function, name):
        self.function = function
        self.name = name
        self.serial = None
        self.called = False

    def __call__(self, *arguments):
        global _threads_started_in
        if forked_after_threads_started():
            if self.serial is None:
                options = {name: value for name, value in self.function.targetoptions.items()
                           if name != "nopython"}
                options.update(parallel=False, cache=False)
                self.serial = numba.njit(**options)(self.function.py_func)
            return self.serial(1, *arguments)
        with _running:
            if self.called:
                result = self.function(numba.get_num_threads(), *arguments)
            else:
                with compiling(self.name):
                    result = self.function(numba.get_num_threads(), *arguments)
                self.called = True
        if _threads_started_in is None:
            _threads_started_in = os.getpid()
        return result
