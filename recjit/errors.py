"""The errors recjit raises, and its warnings. Every failure a user can cause is one of
these errors, never a traceback from inside the compiler or a numba typing error."""
import difflib

import numpy as np


class RecJitError(Exception):
    """Base class of every error recjit raises on purpose."""


class SourceLocated(RecJitError):
    """An error that points at a line of the user's cell function."""

    def __init__(self, message, filename=None, lineno=None, expression=None):
        self.filename = filename
        self.lineno = lineno
        self.expression = expression
        where = f"{filename}:{lineno}: " if filename and lineno else ""
        what = f"\n    {expression}" if expression else ""
        super().__init__(f"{where}{message}{what}")


class RecursionPropertyError(SourceLocated):
    """The recursion cannot be turned into loops: it breaks P.1, P.2 or P.3 (Cortex §2)."""

    def __init__(self, prop, message, filename=None, lineno=None, expression=None):
        self.property = prop
        super().__init__(f"{prop} violated: {message}", filename, lineno, expression)


class UnsupportedError(SourceLocated):
    """The cell function uses a construct outside the cell language (docs/design.md §1)."""


class InputError(RecJitError):
    """A forest, field or parameter that the model cannot run on; names the culprit."""


def did_you_mean(name, names):
    """The end of an error that names something misspelt: `; did you mean 'x'?` with the
    one of `names` closest to `name`, or an empty string where none is close."""
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def is_whole(value):
    """Whether `value` is an integer, Python's or NumPy's, and not a bool (which Python
    counts as one: True would be 1)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def checked_flag(name, value):
    """`value`, an option's True or False; anything else (a string such as "False" is true)
    is an InputError naming the option."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InputError(f"{name} must be True or False, not {value!r}")


class ShapeError(SourceLocated, InputError):
    """A parameter or field whose shape does not fit the operation on the named line."""


class ScheduleError(RecJitError):
    """A schedule that is malformed, or cannot apply to this model or backend; names the
    field."""


class FallbackWarning(UserWarning):
    """A schedule runs in a slower form than asked for, because this device cannot run it as
    asked (a fused CUDA schedule where no cooperative launch is possible); says why."""


class CacheWarning(UserWarning):
    """A file of the kernel cache was damaged (cut short, corrupted) and is being rebuilt; the
    result is computed as if it had never been cached."""
