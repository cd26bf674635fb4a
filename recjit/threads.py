"""How many threads recjit's CPU kernels run on (docs/threads.md)."""
import numba

from .errors import RecJitError, is_whole


def set_num_threads(count):
    """Run the CPU kernels (and the backward's weight products) on `count` threads, in this
    thread of the program, at most `NUMBA_NUM_THREADS` (numba's count when it started: every
    core, unless set in the environment before)."""
    largest = numba.config.NUMBA_NUM_THREADS
    if not is_whole(count) or not 1 <= count <= largest:
        raise RecJitError(f"set_num_threads takes a whole number of threads from 1 to "
                          f"{largest} (NUMBA_NUM_THREADS, numba's count when it started), "
                          f"not {count!r}")
    numba.set_num_threads(int(count))


def get_num_threads():
    """The threads the CPU kernels run on now."""
    return numba.get_num_threads()
