"""Loading generated source: written to a file in the cache directory and imported, so that
numba's on-disk cache (keyed by file) keeps the machine code across processes. Both code
generators load their modules here.

A cache is only a copy: a file that is cut short, corrupted or left half-written (a full disk,
a copy interrupted) is never used. A generated file is compared with the source it must hold
before it is imported, and written again if it differs; an entry of numba's cache that cannot be
loaded is dropped and compiled again. Either says so with a `CacheWarning`."""
import contextlib
import hashlib
import importlib.util
import os
import pathlib
import sys
import tempfile
import threading
import warnings

import numba

from .errors import CacheWarning, RecJitError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

_lock = threading.Lock()
# The modification time of every generated file. numba-cuda's disk cache (0.30) trusts a
# kernel compiled from a file of the same modification time and size, and a file's name holds
# its content's digest, so one time for all is safe; it lets compiled kernels travel with the
# folder to another machine (`tools/gpu_session.sh` carries them from call to call).
SOURCE_MTIME = 1_600_000_000


def cache_dir():
    """`$RECJIT_CACHE_DIR`, else `~/.cache/recjit`."""
    root = os.environ.get("RECJIT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "recjit")
    path = pathlib.Path(root) / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(path, error) from None
    return path


def _unwritable(path, error):
    """The error for a cache directory this process cannot write: where generated kernels go,
    and how to choose another."""
    return RecJitError(f"recjit cannot write its kernel cache at {path} ({error.strerror}): "
                       "set RECJIT_CACHE_DIR to a directory this process may write (compiled "
                       "kernels are kept there for the next process)")


@contextlib.contextmanager
def compiling(name):
    """Hold the machine-wide lock of what compiles as `name` (a file lock in the cache
    directory): processes that would compile the same kernel into an empty cache at once
    take turns, and each after the first loads what the first compiled from numba's disk
    cache instead of compiling it again. Where there is no `fcntl` (Windows), or the file
    system takes no locks (some NFS mounts), each compiles."""
    if fcntl is None:
        yield
        return
    path = cache_dir() / f"{name}.lock"
    try:
        handle = open(path, "a")  # noqa: SIM115 (the `with` below closes it)
    except OSError as error:
        raise _unwritable(path.parent, error) from None
    with handle:
        locked = _locked(handle)
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _locked(handle):
    """Whether this process now holds the lock of file `handle`, waiting for it: False where
    the file system refuses locks."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError:
        return False
    return True


def source_digest(source, runtime):
    """A digest of the source, the runtime modules it imports (numba's cache does not see
    changes there) and numba's version."""
    digest = hashlib.sha256(source.encode()
                            + b"".join(pathlib.Path(path).read_bytes() for path in runtime)
                            + numba.__version__.encode())
    return digest.hexdigest()[:20]


def load_module(source, name, runtime):
    """Import `source` as a module from the cache directory; `runtime` holds the paths of the
    modules of helpers it imports."""
    module_name = f"recjit_generated_{name}_{source_digest(source, runtime)}"
    with _lock:
        if module_name in sys.modules:
            return sys.modules[module_name]
        path = cache_dir() / f"{module_name}.py"
        held = _read_text(path)
        if held != source:
            if held is not None:
                warnings.warn(f"recjit: {path} does not hold the source its name promises (a "
                              "damaged cache); writing it again", CacheWarning, stacklevel=3)
            _write_atomically(path, source)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        guard_caches(module)
        sys.modules[module_name] = module
        return module


def _read_text(path):
    """The text of `path`, or None where there is none to read (no file, or not UTF-8)."""
    try:
        return path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def _write_atomically(path, text):
    """Write `text` to a temporary file beside `path`, then rename it: a reader sees the old
    file or the whole new one, never part of it."""
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp",
                                         delete=False) as handle:
            handle.write(text)
    except OSError as error:
        raise _unwritable(path.parent, error) from None
    os.utime(handle.name, (SOURCE_MTIME, SOURCE_MTIME))
    os.replace(handle.name, path)


def guard_caches(*modules):
    """Make every numba function of `modules` that caches its machine code on disk compile
    again, with a warning, where its cache cannot be read, instead of raising numba's error
    (an `UnpicklingError` from a truncated index, say) at every call."""
    for module in modules:
        for value in vars(module).values():
            cache = getattr(value, "_cache", None)
            if hasattr(cache, "load_overload") and not getattr(cache, "guarded", False):
                _guard(cache, getattr(value, "__qualname__", repr(value)))


def key_caches_by(module, *callees):
    """Key the disk cache of every cached numba function of `module` by the source of the
    modules `callees` too. numba keys a function's machine code by its own file, yet the code
    holds a copy of every function it calls: without this, a change in a callee's module
    left its callers running the old copy beside the new one (a panel width changed in the
    runtime, and not in the per-tree products' copy of it, gave wrong gradients)."""
    sources = hashlib.sha256(b"".join(pathlib.Path(callee.__file__).read_bytes()
                                      for callee in callees)).digest()
    for value in vars(module).values():
        cache_file = getattr(getattr(value, "_cache", None), "_cache_file", None)
        if cache_file is not None and not getattr(cache_file, "keyed_by_callees", False):
            cache_file._source_stamp = (cache_file._source_stamp, sources)
            cache_file.keyed_by_callees = True


def _guard(cache, name):
    load, save = cache.load_overload, cache.save_overload

    def load_overload(signature, target_context):
        try:
            return load(signature, target_context)
        except Exception as error:  # noqa: BLE001 (whatever the damage, compiling is right)
            warnings.warn(f"recjit: the disk cache of {name} cannot be read ({error!r}); "
                          "compiling it again", CacheWarning, stacklevel=2)
            try:
                cache.flush()  # an empty index in place of the damaged one
            except OSError:
                pass
            return None

    def save_overload(signature, data):
        try:
            save(signature, data)
        except Exception as error:  # noqa: BLE001 (the compiled code works without its copy)
            warnings.warn(f"recjit: the machine code of {name} could not be cached on disk "
                          f"({error!r}); it is kept in memory", CacheWarning, stacklevel=2)

    cache.load_overload, cache.save_overload, cache.guarded = load_overload, save_overload, True
