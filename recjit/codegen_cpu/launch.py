"""Calling the CPU backend's numba parallel functions (the kernels, the backward's weight
products): one at a time in a process, and in a process forked after they ran.

Numba runs a parallel function on GNU OpenMP's threads here, and in a process forked from one
whose threads have started, numba kills the process at its next parallel call ("fork() called
from a process already using GNU OpenMP"): `multiprocessing`'s default on Linux, and every
DataLoader worker. There, a `Launcher` calls the same function compiled without `parallel`,
on the one thread the child has (docs/threads.md).

A `Launcher` also chooses, per size of input, between all the threads it may use and one: on
a machine where other processes hold the cores (a test suite, another training run), a
parallel call waits at every barrier for a thread that is off its core, and one thread is
faster (`ThreadChoice`)."""
import collections
import math
import os
import statistics
import threading
import time

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


class ThreadChoice:
    """Between all the threads a call may use and one, the faster for inputs of one size
    class (a power of two of `size`), by the median time of each count's last `WINDOW`
    calls. Each count is tried `TRIES` times first, in turn; then every `PROBE`-th call tries
    the slower, so that the choice follows the machine as its load comes and goes. A median,
    not a mean: one call that ran ten times as long (a thread off its core at a barrier,
    memory touched for the first time) held a mean up for hundreds of calls, and with it a
    process on one thread on a quiet machine. Results do not depend on the count."""

    PROBE = 32
    TRIES = 3
    WINDOW = 5

    def __init__(self):
        self.seconds = {}  # (size class, threads) -> the seconds of its last WINDOW calls
        self.calls = {}  # size class -> calls so far

    def threads(self, size, most):
        """The thread count for the next call of this size, at most `most`."""
        if most == 1:
            return 1
        kind = self.size_class(size)
        calls = self.calls[kind] = self.calls.get(kind, 0) + 1
        many, one = (self.seconds.get((kind, count), ()) for count in (most, 1))
        if min(len(many), len(one)) < self.TRIES:  # try each in turn first
            return most if len(many) <= len(one) else 1
        faster, slower = (most, 1) if statistics.median(many) <= statistics.median(one) \
            else (1, most)
        return slower if calls % self.PROBE == 0 else faster

    def took(self, size, threads, seconds):
        key = (self.size_class(size), threads)
        self.seconds.setdefault(key, collections.deque(maxlen=self.WINDOW)).append(seconds)

    @staticmethod
    def size_class(size):
        return 0 if size is None else int(math.log2(size + 1))


class Launcher:
    """`launch(*arguments, size=None)` calls `function(workers, *arguments)`, a numba
    parallel function whose first argument is the thread count: numba's count (what
    `rj.set_num_threads` set), or one where that has been faster lately for inputs of this
    `size` (`ThreadChoice`); in a process forked after the threads started, its serial twin
    with one worker. Its first call, which compiles the function or loads it from numba's
    disk cache, holds the machine-wide lock `name` (`generated.compiling`)."""

    def __init__(self, function, name):
        self.function = function
        self.name = name
        self.serial = None
        self.called = False
        self.choice = ThreadChoice()

    def __call__(self, *arguments, size=None):
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
                result = self._timed(arguments, size)
            else:
                with compiling(self.name):
                    result = self.function(numba.get_num_threads(), *arguments)
                self.called = True
        if _threads_started_in is None:
            _threads_started_in = os.getpid()
        return result

    def _timed(self, arguments, size):
        """A call on the threads `choice` picks, timed for it."""
        most = numba.get_num_threads()
        threads = self.choice.threads(size, most)
        if threads != most:
            numba.set_num_threads(threads)
        started = time.perf_counter()
        try:
            return self.function(threads, *arguments)
        finally:
            self.choice.took(size, threads, time.perf_counter() - started)
            if threads != most:
                numba.set_num_threads(most)
