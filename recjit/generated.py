"""Loading generated source: written to a file in the cache directory and imported, so that
numba's on-disk cache (keyed by file) keeps the machine code across processes. Both code
generators load their modules here."""
import hashlib
import importlib.util
import os
import pathlib
import sys
import tempfile
import threading

import numba

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
    path.mkdir(parents=True, exist_ok=True)
    return path


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
        if not path.exists():
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp",
                                             delete=False) as handle:
                handle.write(source)
            os.utime(handle.name, (SOURCE_MTIME, SOURCE_MTIME))
            os.replace(handle.name, path)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
        return module
