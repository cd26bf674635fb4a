"""Compile every generated CUDA kernel of the model zoo to PTX, without a GPU.

numba's simulator runs the generated kernels as Python, so it cannot catch what only numba's
CUDA compiler sees (typing, float64 creeping into float32 kernels). This script runs the zoo
under the simulator, records every launched kernel with its argument types, then compiles each
with numba-cuda and NVVM for sm_90 in a second process, and counts float64 instructions in the
float32 kernels and the hardware's approximate tanh in any kernel (there should be none). Where
the CUDA toolkit's `ptxas` is at hand ($CUDA_HOME/bin, the nvcc wheel's), each fused kernel is
assembled too, at the registers its launch bound leaves a thread
(`recjit.schedule.MAX_THREADS`), and its registers and the bytes it spills are printed: the
kernels sit at that bound, and a change that makes one spill inside its products' loops costs
time on a GPU that the simulator never shows.

    make ptx-check       # sets up .venv-ptx (numba-cuda, NVVM from pip wheels) and runs this
    PTX_MODELS=tree_fc,tree_lstm make ptx-check     # those models' kernels only (the whole
                                                    # zoo takes most of an hour on 2 cores)

`get_current_device` is stubbed to an sm_90 device while compiling: numba-cuda asks the
driver for the compute capability before compiling a device function."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN, VOCAB = 8, 12


def record(path):
    """Under the simulator: run every model, fused and unfused, refactored or not, float32 and
    float64; every model unspecialized and unbatched once; and every model's backward, fused
    and unfused."""
    sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
    import numpy as np

    import recjit as rj
    from recjit.codegen_cuda import runtime
    dispatcher_type = type(runtime.matmul_kernel)
    launch = dispatcher_type.__call__
    kernels = {}  # {(file, kernel, signature): the schedule it was first launched under}
    running = {"schedule": ""}

    def numba_type(value):
        array = getattr(getattr(value, "_ary", value), "_ary", getattr(value, "_ary", value))
        if isinstance(value, (int, np.integer)) or not getattr(array, "ndim", 0):
            return "int64"
        last = "::1" if array.flags.c_contiguous else ":"  # a block of a weight's columns
        return f"{array.dtype}[{', '.join([':'] * (array.ndim - 1) + [last])}]"

    def recording(self, *arguments):
        if not self._device:
            signature = tuple(numba_type(a) for a in arguments)
            kernels.setdefault((self.fn.__code__.co_filename, self.fn.__name__, signature),
                               running["schedule"])
        return launch(self, *arguments)

    dispatcher_type.__call__ = recording
    import dag_rnn, gru, lstm, mv_rnn, simple_tree_gru, tree_attention, tree_fc, tree_gru, \
        tree_lstm, tree_rnn
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
             (tree_attention.tree_attention, nary, tree_attention.make_params),
             (lstm.lstm, chains, lstm.make_params), (gru.gru, chains, gru.make_params)]
    for dtype in ("float32", "float64"):
        runs = [(model, forest, make(HIDDEN, VOCAB, dtype, 0)) for model, forest, make in cases]
        runs.append((dag_rnn.dag_rnn, dag_rnn.grids(2, HIDDEN, 3, 3, dtype=dtype),
                     dag_rnn.make_params(HIDDEN, dtype=dtype)))
        schedules = [rj.Schedule(fusion=fusion, refactor=refactor)
                     for fusion in (True, False) for refactor in (True, False)]
        schedules += [rj.Schedule(specialize=False), rj.Schedule(dynamic_batching=False)]
        unrolled = [rj.Schedule(unroll=2), rj.Schedule(unroll=3, fusion=False)]
        wanted = os.environ.get("PTX_MODELS")
        for model, forest, p in runs:
            if wanted and model.__name__ not in wanted.split(","):
                continue
            for schedule in schedules + (unrolled if model.kind != "dag" else []):
                running["schedule"] = ", ".join(
                    f"{field.name}={getattr(schedule, field.name)}" for field in fields(schedule)
                    if getattr(schedule, field.name) != field.default)
                model.run(forest, p, backend="cuda", schedule=schedule)
            for schedule in (rj.Schedule(), rj.Schedule(fusion=False)):  # the backward's
                running["schedule"] = f"backward{'' if schedule.fusion else ', fusion=False'}"
                out, pullback = model.vjp(forest, p, backend="cuda", schedule=schedule)
                pullback(roots=tuple(np.ones(state.shape, state.dtype) for state in out.roots))
    with open(path, "w") as handle:
        json.dump([[*key, schedule] for key, schedule in kernels.items()], handle)


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
    for file, name, signature, schedule in kernels:
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
        approximate = ptx.count("tanh.approx")  # 2^-11 relative: the kernels define their own
        failures += doubles > 0 or approximate > 0
        print(f"ok   {name} ({'float32' if float32 else 'float64'}"
              f"{'; ' + schedule if schedule else ''}): {len(ptx)} bytes of PTX"
              + (f", {doubles} float64 instructions" if doubles else "")
              + (f", {approximate} tanh.approx instructions" if approximate else "")
              + (registers(ptx) if name.endswith(("_kernel", "_backward")) else ""))
    print(f"{failures} failures")
    return failures


def registers(ptx):
    """", N registers, S/L bytes spilled (stores/loads)" of a kernel assembled by ptxas for
    sm_90 at the registers a thread of a MAX_THREADS block may use; "" without ptxas."""
    from recjit.schedule import MAX_THREADS
    ptxas = os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "ptxas")
    if not os.path.exists(ptxas):
        return ""
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.join(scratch, "kernel.ptx")
        with open(source, "w") as handle:
            handle.write(ptx)
        report = subprocess.run([ptxas, "-arch=sm_90", "-c", "-v",
                                 f"--maxrregcount={65536 // MAX_THREADS}", source,
                                 "-o", os.path.join(scratch, "kernel.cubin")],
                                capture_output=True, text=True).stderr
    used = re.findall(r"Used (\d+) registers", report)
    spilled = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if not used or not spilled:
        return ", ptxas: " + (report.strip().splitlines() or ["no report"])[-1]
    return f", {used[-1]} registers, {spilled[-1][0]}/{spilled[-1][1]} bytes spilled"


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
