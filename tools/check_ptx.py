"""Compile every generated CUDA kernel of the model zoo to PTX, without a GPU.

numba's simulator runs the generated kernels as Python, so it cannot catch what only numba's
CUDA compiler sees (typing, float64 creeping into float32 kernels). This script runs the zoo
under the simulator, records every launched kernel with its argument types, then compiles each
with numba-cuda and NVVM for sm_90 in a second process, and counts float64 instructions in the
float32 kernels (there should be none).

    make ptx-check       # sets up .venv-ptx (numba-cuda, NVVM from pip wheels) and runs this

`get_current_device` is stubbed to an sm_90 device while compiling: numba-cuda asks the
driver for the compute capability before compiling a device function."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN, VOCAB = 8, 12


def record(path):
    """Under the simulator: run every model, fused and unfused, refactored or not, float32 and
    float64; and every model unspecialized and unbatched once."""
    sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
    import numpy as np

    import recjit as rj
    from recjit.codegen_cuda import runtime
    dispatcher_type = type(runtime.matmul_kernel)
    launch = dispatcher_type.__call__
    kernels = {}

    def numba_type(value):
        array = getattr(getattr(value, "_ary", value), "_ary", getattr(value, "_ary", value))
        if isinstance(value, (int, np.integer)) or not getattr(array, "ndim", 0):
            return "int64"
        last = "::1" if array.flags.c_contiguous else ":"  # a block of a weight's columns
        return f"{array.dtype}[{', '.join([':'] * (array.ndim - 1) + [last])}]"

    def recording(self, *arguments):
        if not self._device:
            signature = tuple(numba_type(a) for a in arguments)
            kernels[(self.fn.__code__.co_filename, self.fn.__name__, signature)] = None
        return launch(self, *arguments)

    dispatcher_type.__call__ = recording
    import dag_rnn, gru, lstm, mv_rnn, simple_tree_gru, tree_fc, tree_gru, tree_lstm, tree_rnn
    tree = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    nary = rj.Forest.from_nested([((1, 2, 3), (4, 5)), (6, 7, 8, 9)])
    chains = rj.Forest.from_sequences([3, 2], fields={"word": [1, 2, 3, 4, 5]})
    cases = [(tree_fc.tree_fc, tree, tree_fc.make_params),
             (tree_rnn.tree_rnn, tree, tree_rnn.make_params),
             (tree_lstm.tree_lstm, tree, tree_lstm.make_params),
             (mv_rnn.mv_rnn, tree, mv_rnn.make_params),
             (tree_gru.tree_gru, nary, tree_gru.make_params),
             (simple_tree_gru.simple_tree_gru, nary, tree_gru.make_params),
             (tree_lstm.child_sum_tree_lstm, nary, tree_lstm.make_params),
             (lstm.lstm, chains, lstm.make_params), (gru.gru, chains, gru.make_params)]
    for dtype in ("float32", "float64"):
        runs = [(model, forest, make(HIDDEN, VOCAB, dtype, 0)) for model, forest, make in cases]
        runs.append((dag_rnn.dag_rnn, dag_rnn.grids(2, HIDDEN, 3, 3, dtype=dtype),
                     dag_rnn.make_params(HIDDEN, dtype=dtype)))
        schedules = [rj.Schedule(fusion=fusion, refactor=refactor)
                     for fusion in (True, False) for refactor in (True, False)]
        schedules += [rj.Schedule(specialize=False), rj.Schedule(dynamic_batching=False)]
        unrolled = [rj.Schedule(unroll=2), rj.Schedule(unroll=3, fusion=False)]
        for model, forest, p in runs:
            for schedule in schedules + (unrolled if model.kind != "dag" else []):
                model.run(forest, p, backend="cuda", schedule=schedule)
    with open(path, "w") as handle:
        json.dump([list(key) for key in kernels], handle)


def compile_all(path):
    """With numba-cuda and NVVM: each recorded kernel to PTX for sm_90."""
    import numba.cuda.dispatcher as dispatcher_module
    from numba import cuda

    class Sm90:
        compute_capability = (9, 0)

    dispatcher_module.get_current_device = lambda: Sm90()
    failures = 0
    with open(path) as handle:
        kernels = json.load(handle)
    for file, name, signature in kernels:
        spec = importlib.util.spec_from_file_location(f"generated_{abs(hash(file))}", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        try:
            ptx, _ = cuda.compile_ptx(getattr(module, name).py_func,
                                      f"void({', '.join(signature)})", cc=(9, 0))
        except Exception as error:  # noqa: BLE001 (any compile failure is reported, counted)
            failures += 1
            print(f"FAIL {name} ({os.path.basename(file)}): {error}")
            continue
        float32 = all("float64" not in s for s in signature)
        doubles = len(re.findall(r"^\s*\w+(\.\w+)*\.f64\b", ptx, re.MULTILINE)) if float32 else 0
        failures += doubles > 0
        print(f"ok   {name} ({'float32' if float32 else 'float64'}): {len(ptx)} bytes of PTX"
              + (f", {doubles} float64 instructions" if doubles else ""))
    print(f"{failures} failures")
    return failures


def main():
    if sys.argv[1:2] == ["--record"]:
        return record(sys.argv[2])
    if sys.argv[1:2] == ["--compile"]:
        return 1 if compile_all(sys.argv[2]) else 0
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    with tempfile.TemporaryDirectory() as scratch:
        kernels = os.path.join(scratch, "kernels.json")
        environment = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1",
                       "RECJIT_CACHE_DIR": os.path.join(scratch, "cache")}
        subprocess.run([python, __file__, "--record", kernels], env=environment, check=True)
        environment.pop("NUMBA_ENABLE_CUDASIM")
        return subprocess.run([python, __file__, "--compile", kernels],
                              env={**environment, "PYTHONPATH": ROOT}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
