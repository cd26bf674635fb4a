"""A damaged kernel cache is never used: a generated file that does not hold the source its
name promises is written again, and an entry of numba's cache that cannot be read is compiled
again; either with a `CacheWarning`, and the result is what it would have been uncached."""
import os
import subprocess
import sys
import warnings

import pytest

import recjit as rj
from recjit.generated import cache_dir, load_module

SOURCE = '''"""A generated module, as the code generators write one."""
from numba import njit


@njit(cache=True)
def affine(x):
    y = x * 2.0
    y = y + 1.0
    return y
'''
CUT = 7  # the lines before `y = y + 1.0`: a file cut there still imports, computing something else


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RECJIT_CACHE_DIR", str(tmp_path))
    return tmp_path


def load_fresh(name):
    """The module as a new process loads it: from the files in the cache directory."""
    for module in [m for m in sys.modules if m.startswith(f"recjit_generated_{name}_")]:
        del sys.modules[module]
    return load_module(SOURCE, name, ())


def affine_from_the_cache(name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = load_fresh(name).affine(3.0)
    return value, [w for w in caught if issubclass(w.category, rj.CacheWarning)]


def only_file(pattern):
    (path,) = cache_dir().glob(pattern)
    return path


def cut(data):
    return data[:len(data) // 2]


def zeroed(data):
    return data[:16] + bytes(len(data) - 32) + data[-16:]


def source_cut_at_a_line(data):
    return b"".join(data.splitlines(keepends=True)[:CUT])


def source_with_a_changed_byte(data):
    return data.replace(b"2.0", b"3.0")


@pytest.mark.parametrize("pattern, damage", [
    ("*.py", source_cut_at_a_line), ("*.py", cut), ("*.py", source_with_a_changed_byte),
    ("__pycache__/*.nbi", cut), ("__pycache__/*.nbi", lambda data: b""),
    ("__pycache__/*.nbc", cut), ("__pycache__/*.nbc", zeroed)],
    ids=["source cut at a line", "source cut in a line", "source of the same size changed",
         "index cut", "index empty", "machine code cut", "machine code zeroed"])
def test_a_damaged_cache_file_is_rebuilt_with_a_warning_and_the_result_is_right(
        cache, request, pattern, damage):
    name = "damage_" + request.node.callspec.id.replace(" ", "_")
    assert affine_from_the_cache(name) == (7.0, [])
    path = only_file(pattern)
    path.write_bytes(damage(path.read_bytes()))
    value, caught = affine_from_the_cache(name)
    assert value == 7.0
    assert len(caught) == 1
    assert any(words in str(caught[0].message) for words in ("compiling it again",
                                                              "writing it again"))
    assert affine_from_the_cache(name) == (7.0, [])  # the cache is whole again


def test_a_generated_file_is_written_by_renaming_a_whole_temporary_one(cache):
    load_fresh("atomic")
    assert [p.name for p in cache_dir().iterdir() if p.suffix == ".tmp"] == []
    assert only_file("recjit_generated_atomic_*.py").read_text() == SOURCE


PROGRAM = """
import sys, warnings
import numpy as np
sys.path.insert(0, 'examples')
import recjit as rj
from tree_rnn import make_params, tree_rnn
warnings.simplefilter('always')
forest = rj.Forest.random_binary(3, seed=2, vocab_size=10)
p = make_params(4, 10, 'float64')
got, want = tree_rnn.run(forest, p), tree_rnn.reference(forest, p)
print(max(float(np.abs(g - w).max()) for g, w in zip(got.nodes, want.nodes)))
"""


def test_a_kernel_whose_file_was_cut_is_rebuilt_in_a_new_process(tmp_path):
    """The adversarial case: a generated kernel cut after its first 46 lines still imports and
    computed wrong results."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = dict(os.environ, RECJIT_CACHE_DIR=str(tmp_path))

    def run():
        return subprocess.run([sys.executable, "-c", PROGRAM], cwd=root, env=environment,
                              capture_output=True, text=True, timeout=300, check=True)

    assert float(run().stdout) < 1e-12
    (kernel,) = (tmp_path / "kernels").glob("recjit_generated_tree_rnn_kernel_*.py")
    kernel.write_text("".join(kernel.read_text().splitlines(keepends=True)[:46]))
    again = run()
    assert float(again.stdout) < 1e-12
    assert "CacheWarning" in again.stderr and kernel.name in again.stderr


CALLEE = '''from numba import njit


@njit(cache=True)
def value():
    return {value}
'''
CALLER = '''from numba import njit

import callee


@njit(cache=True)
def total():
    return callee.value() + 1
'''
CALLS = """
import sys
sys.path.insert(0, {folder!r})
import callee, caller
from recjit.generated import key_caches_by
key_caches_by(caller, callee)
print(caller.total())
"""


def test_a_cached_function_compiles_again_when_a_module_it_calls_has_changed(tmp_path):
    """numba's own key would load the caller's copy of the old callee: 1 + 1, not 5 + 1."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def total():
        result = subprocess.run([sys.executable, "-c", CALLS.format(folder=str(tmp_path))],
                                cwd=root, capture_output=True, text=True, timeout=300,
                                check=True)
        return int(result.stdout)

    (tmp_path / "caller.py").write_text(CALLER)
    (tmp_path / "callee.py").write_text(CALLEE.format(value=1))
    assert total() == 2
    (tmp_path / "callee.py").write_text(CALLEE.format(value=5))
    assert total() == 6


def test_a_cache_directory_that_cannot_be_written_is_refused_naming_it(tmp_path, monkeypatch):
    """Before any kernel compiles: the directory, why, and the variable that chooses another."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("RECJIT_CACHE_DIR", str(blocker / "cache"))
    for module in [m for m in sys.modules if m.startswith("recjit_generated_unwritable_")]:
        del sys.modules[module]
    with pytest.raises(rj.RecJitError, match=r"cannot write its kernel cache at .*a_file/cache/"
                                             r"kernels \(Not a directory\): set "
                                             r"RECJIT_CACHE_DIR to a directory"):
        load_module(SOURCE, "unwritable", ())
