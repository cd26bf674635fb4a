"""`run` from several threads at once, the compile cache's keys, and kernels loaded from the
disk cache."""
import importlib.util
import io
import os
import platform
import queue
import subprocess
import sys
import threading

import numpy as np
import pytest

import recjit as rj
from recjit.generated import SOURCE_MTIME, load_module
from tree_lstm import make_params, tree_lstm

from conftest import assert_same_result


def test_run_from_several_threads_at_once_equals_the_reference():
    forests = [rj.Forest.random_binary(3, seed=s, vocab_size=20) for s in range(8)]
    p = make_params(8, 20, "float64", seed=5)
    tree_lstm.run(forests[0], p)
    results = [None] * len(forests)

    def work(index):
        for _ in range(5):
            results[index] = tree_lstm.run(forests[index], p)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(forests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for forest, result in zip(forests, results):
        assert_same_result(result, tree_lstm.reference(forest, p))


def test_forests_prepared_in_one_thread_while_another_runs_them_equal_the_reference():
    """A data loader's pattern: the CPU kernel and the linearizer release the GIL, so one
    thread prepares the next forest while another runs the last one."""
    from recjit.linearize.linearizer import _linearize
    forests = [rj.Forest.random_binary(3, seed=s, vocab_size=20) for s in range(6)]
    p = make_params(8, 20, "float64", seed=6)
    kernel = tree_lstm.compile(forests[0], p).backend_kernel
    assert kernel.function.targetoptions["nogil"] and _linearize.targetoptions["nogil"]
    ready = queue.Queue(maxsize=2)

    def load():
        for forest in forests:
            ready.put(tree_lstm.prepare(forest, p))

    loader = threading.Thread(target=load)
    loader.start()
    results = [tree_lstm.run(ready.get(), p) for _ in forests]
    loader.join()
    for forest, result in zip(forests, results):
        assert_same_result(result, tree_lstm.reference(forest, p))


def test_a_changed_cell_function_compiles_again():
    forest = rj.Forest.from_nested([(0, (1, 2))])
    p = rj.Params(E=np.arange(6.0).reshape(3, 2), W=np.eye(2))

    @rj.recursive_model
    def cell(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return rj.tanh(p.W @ (cell(node.left, p) + cell(node.right, p)))
    first = cell.run(forest, p).roots[0]

    @rj.recursive_model  # the same name with a new body, as after an edit
    def cell(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return rj.tanh(p.W @ (cell(node.left, p) - cell(node.right, p)))
    second = cell.run(forest, p).roots[0]
    assert not np.allclose(first, second)
    np.testing.assert_allclose(second, cell.reference(forest, p).roots[0], rtol=1e-12)


SCALE = 0.5  # a module constant a cell reads: test_a_global_constant_bound_again_...


@rj.recursive_model
def scaled_cell(node, p):
    if node.is_leaf:
        return p.E[node.word] * SCALE
    return rj.tanh(scaled_cell(node.left, p) + scaled_cell(node.right, p)) * SCALE


def test_a_global_constant_bound_again_compiles_again():
    """A kernel is compiled for the constants the cell reads; the plain recursion reads them
    when it runs, so a run after `SCALE = 2.0` must too."""
    global SCALE
    forest = rj.Forest.from_nested([(0, (1, 2))])
    p = rj.Params(E=np.arange(6.0).reshape(3, 2) / 6)
    try:
        for SCALE in (0.5, 2.0):
            assert_same_result(scaled_cell.run(forest, p), scaled_cell.reference(forest, p))
    finally:
        SCALE = 0.5


def test_explain_lists_the_names_read_from_outside_the_cell_with_the_constants_values():
    text = scaled_cell.explain(rj.Forest.from_nested([(0, 1)]),
                               rj.Params(E=np.ones((2, 2))), file=io.StringIO())
    assert ("names read from outside the cell (a run compiles again where one changed): "
            "SCALE = 0.5, rj.tanh, scaled_cell") in text


def test_a_constant_bound_again_to_an_equal_value_reuses_its_kernel():
    global SCALE
    forest = rj.Forest.from_nested([(0, (1, 2))])
    p = rj.Params(E=np.arange(6.0).reshape(3, 2))
    first = scaled_cell.compile(forest, p)
    try:
        SCALE = float("0.5")  # another float object, the same value
        assert scaled_cell.compile(forest, p) is first
    finally:
        SCALE = 0.5


WEIGHTS = [0.5, 0.25]  # a module list a cell loops over: changed in place below


@rj.recursive_model
def weighted_cell(node, p):
    if node.is_leaf:
        return p.E[node.word]
    children = (weighted_cell(node.left, p), weighted_cell(node.right, p))
    return rj.tanh(sum(child * weight for child, weight in zip_pairs(children, WEIGHTS)))


def zip_pairs(first, second):
    return [(first[k], second[k]) for k in range(len(first))]


def test_a_module_list_changed_in_place_compiles_again():
    forest = rj.Forest.from_nested([(0, (1, 2))])
    p = rj.Params(E=np.arange(6.0).reshape(3, 2) / 6)
    try:
        for weight in (0.25, -3.0):
            WEIGHTS[1] = weight
            assert_same_result(weighted_cell.run(forest, p), weighted_cell.reference(forest, p))
    finally:
        WEIGHTS[1] = 0.25


def test_a_cell_analysed_again_reads_the_source_it_was_defined_with(tmp_path):
    """Rebinding a constant analyses the cell again; a file edited since then (not reloaded)
    no longer holds the running function's source, and must not be read."""
    path = tmp_path / "edited_cell.py"
    source = ("import recjit as rj\nSCALE = 0.5\n\n@rj.recursive_model\ndef cell(node, p):\n"
              "    if node.is_leaf:\n        return p.E[node.word] * SCALE\n"
              "    return rj.tanh(cell(node.left, p) + cell(node.right, p))\n")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("edited_cell", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    forest, p = rj.Forest.from_nested([(0, (1, 2))]), rj.Params(E=np.arange(6.0).reshape(3, 2))
    module.cell.run(forest, p)
    path.write_text(source.replace("cell(node.left, p) + cell", "cell(node.left, p) - cell"))
    os.utime(path, (os.path.getatime(path), os.path.getmtime(path) + 10))
    module.SCALE = 2.0
    assert_same_result(module.cell.run(forest, p), module.cell.reference(forest, p))


def test_a_helper_bound_again_in_an_enclosing_scope_compiles_again():
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = rj.Params(E=np.arange(6.0).reshape(3, 2) / 6, W=np.eye(2) * 0.5)
    activation = rj.tanh

    def combine(left, right):
        return activation(p_W(left) + right)

    def p_W(x):
        return x * 3.0

    @rj.recursive_model
    def cell(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return combine(cell(node.left, p), cell(node.right, p))

    results = []
    for activation in (rj.tanh, rj.sigmoid):
        results.append(cell.run(forest, p))
        assert_same_result(results[-1], cell.reference(forest, p))
    assert not np.allclose(results[0].roots[0], results[1].roots[0])

    def p_W(x):  # noqa: F811 (the helper of the helper defined again, as after an edit)
        return x * -1.0
    assert_same_result(cell.run(forest, p), cell.reference(forest, p))


def test_new_dtypes_and_schedules_compile_new_kernels_with_the_output_dtype_of_the_params():
    forest = rj.Forest.from_nested([(0, (1, 2))])
    double, single = make_params(4, 3, "float64"), make_params(4, 3, "float32")
    assert tree_lstm.run(forest, double).roots[0].dtype == np.float64
    assert tree_lstm.run(forest, single).roots[0].dtype == np.float32
    exact = rj.Schedule(fast_math=False)
    assert tree_lstm.compile(forest, single, schedule=exact) is not tree_lstm.compile(forest,
                                                                                      single)


def test_a_kernel_loaded_from_the_disk_cache_in_a_new_process_finds_the_runtime():
    """Kernels call the runtime's products by a symbol that `CpuKernel` registers; a kernel
    that numba loads from its cache is not compiled again, and must find them all the same."""
    forest = rj.Forest.random_binary(4, seed=1, vocab_size=20)
    tree_lstm.run(forest, make_params(8, 20, "float64", seed=5))
    program = ("import sys; sys.path.insert(0, 'examples'); import numpy as np\n"
               "import recjit as rj; from tree_lstm import tree_lstm, make_params\n"
               "forest = rj.Forest.random_binary(4, seed=1, vocab_size=20)\n"
               "p = make_params(8, 20, 'float64', seed=5)\n"
               "got, want = tree_lstm.run(forest, p), tree_lstm.reference(forest, p)\n"
               "kernel = tree_lstm.compile(forest, p).backend_kernel.function\n"
               "print(sum(kernel.stats.cache_hits.values()))\n"
               "print(max(float(np.abs(g - w).max()) for g, w in zip(got.nodes, want.nodes)))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True,
                            text=True, timeout=300, check=True).stdout.split()
    cache_hits, difference = int(output[0]), float(output[1])
    assert cache_hits == 1
    assert difference < 1e-12


RUN_MV_RNN = """
import hashlib, sys
sys.path.insert(0, 'examples')
import recjit as rj
from mv_rnn import mv_rnn, make_params
forest, p = rj.Forest.random_binary(10, seed=1, vocab_size=1000), make_params(64, 1000)
states = mv_rnn.run(forest, p).nodes[0]
kernel = mv_rnn.compile(forest, p).backend_kernel.function
print(sum(kernel.stats.cache_hits.values()), hashlib.sha1(states.tobytes()).hexdigest())
"""


def test_a_fast_math_kernel_gives_the_same_bits_compiled_as_loaded_from_the_cache(tmp_path):
    """MV-RNN h64 in float32 (fast math), compiled in one process into an empty cache, then
    loaded from it in another: the same states to the bit (with `nsz` among its flags, the two
    differed in the last bits)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = {**os.environ, "RECJIT_CACHE_DIR": str(tmp_path)}
    (compiled_hits, compiled), (loaded_hits, loaded) = (
        subprocess.run([sys.executable, "-c", RUN_MV_RNN], cwd=root, env=environment,
                       capture_output=True, text=True, timeout=300, check=True).stdout.split()
        for _ in range(2))
    assert (compiled_hits, loaded_hits) == ("0", "1")
    assert compiled == loaded


PAGE_FAULTS_A_RUN = """
import resource, sys
sys.path.insert(0, 'examples')
import recjit as rj
from tree_fc import tree_fc, make_params
forest, p = rj.Forest.perfect(7, num_trees=10), make_params(256, 1000)
for _ in range(3):
    tree_fc.run(forest, p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    tree_fc.run(forest, p)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_a_cpu_run_does_not_fault_in_fresh_pages_for_its_states_and_scratch():
    """TreeFC h256 on 10 perfect trees: 2.6 MB of states and megabytes of scratch a run. In a
    new process (glibc's state is the process's own), before
    `codegen_cpu.keep_large_blocks_in_the_heap`, each run faulted in ~1300 pages."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = subprocess.run([sys.executable, "-c", PAGE_FAULTS_A_RUN], cwd=root,
                            capture_output=True, text=True, timeout=600, check=True).stdout
    assert float(output) < 50


def test_generated_files_share_one_whole_second_modification_time(tmp_path, monkeypatch):
    """numba-cuda's disk cache trusts a kernel compiled from a file of the same modification
    time and size; one whole-second time for every generated file (each named by its
    content's digest) keeps that true for kernels carried to another machine in an archive."""
    monkeypatch.setenv("RECJIT_CACHE_DIR", str(tmp_path))
    module = load_module("ANSWER = 42\n", "modification_time_probe", ())
    assert module.__file__.startswith(str(tmp_path))
    assert os.stat(module.__file__).st_mtime == SOURCE_MTIME == int(SOURCE_MTIME)


HOLDS_THE_LOCK = """
import fcntl, sys
with open(sys.argv[1], "a") as handle:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("free")
    except BlockingIOError:
        print("held")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="file locks need fcntl")
def test_a_compile_holds_a_machine_wide_lock_that_other_processes_wait_for(tmp_path,
                                                                          monkeypatch):
    """Processes that would compile one kernel into an empty cache take turns, so that the
    later ones load it from numba's disk cache."""
    from recjit.generated import cache_dir, compiling
    monkeypatch.setenv("RECJIT_CACHE_DIR", str(tmp_path))
    lock = str(cache_dir() / "a_kernel.lock")

    def other_process_sees():
        return subprocess.run([sys.executable, "-c", HOLDS_THE_LOCK, lock], check=True,
                              capture_output=True, text=True).stdout.strip()

    with compiling("a_kernel"):
        assert other_process_sees() == "held"
    assert other_process_sees() == "free"


@pytest.mark.skipif(sys.platform == "win32", reason="file locks need fcntl")
def test_a_file_system_that_takes_no_locks_compiles_without_one(tmp_path, monkeypatch):
    """Some NFS mounts refuse flock (ENOLCK): each process then compiles, as on Windows."""
    import errno
    import fcntl

    from recjit import generated
    monkeypatch.setenv("RECJIT_CACHE_DIR", str(tmp_path))

    def refused(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refused)
    ran = []
    with generated.compiling("a_kernel"):
        ran.append(True)
    assert ran == [True]
