"""recjit where users run it (docs/threads.md, docs/processes.md): latency back to back, after
a pause, and beside another process; and compiling one kernel in several processes at once.

    python benchmarks/bench_machine.py [--quick] [--machine NAME]

- Latency, TreeLSTM h256 on 10 trees and TreeRNN h256 on 1 tree, float32: median and 95th
  percentile back to back; median with a 10 ms pause before each call (threads asleep, the
  weights cold); median and 95th percentile while a second process runs the same loop.
- Compiling: TreeGRU into an empty cache in one process, then in four at once (each process's
  wall time, the import included), and the resident memory the process's first run added,
  compiled and loaded from the cache by the next process (docs/memory.md).
- A corpus: TreeLSTM h150 over SST train (8,544 trees), float32, in batches of 256, the PTB
  file read and run: one process on every core, against `recjit.dask` on a local cluster of
  2 worker processes of one thread each (median of 3 passes, after one that compiles; and
  the first pass, workers' compiles included). Where SST or Dask is absent, it says so.

Writes benchmarks/results/machine-<machine>.json and .md. A benchmark, never a test."""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench import write_results

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")

LATENCY = """
import json, sys, time
sys.path.insert(0, {examples!r})
import numpy as np
import recjit as rj
from {module} import {model} as model, make_params
p = make_params(256, 1000, "float32", 0)
forest = rj.Forest.random_binary({trees}, seed=1, vocab_size=1000)
model.run(forest, p)
def times(seconds, pause):
    result, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        if pause:
            time.sleep(pause)
        started = time.perf_counter()
        model.run(forest, p)
        result.append(time.perf_counter() - started)
    return 1e3 * np.array(result)
back = times({seconds}, 0)
paused = times({seconds}, 0.01)
print(json.dumps({{"median": float(np.median(back)), "p95": float(np.percentile(back, 95)),
                  "after a pause": float(np.median(paused))}}))
"""

COMPILE = """
import json, sys, time
started = time.perf_counter()
sys.path.insert(0, {examples!r})
import recjit as rj
from tree_gru import make_params, tree_gru
def resident_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))
forest = rj.Forest.random_binary(3, seed=0, vocab_size=20)
before = resident_mb()
tree_gru.run(forest, make_params(7, 20, "float64"))
print(json.dumps({{"s": time.perf_counter() - started, "resident MB": resident_mb() - before}}))
"""

CORPUS = """
import json, sys, time
sys.path.insert(0, {examples!r})
import numpy as np
import recjit as rj
from tree_lstm import tree_lstm, make_params
forest = rj.Forest.from_ptb(open({path!r}))
p = make_params(150, len(forest.vocab), "float32", 0)
def run_only():
    return np.concatenate([tree_lstm.run(batch, p).roots[0] for batch in forest.batches(256)])
def one_process():
    read = rj.Forest.from_ptb(open({path!r}), vocab=dict(forest.vocab))
    return np.concatenate([tree_lstm.run(batch, p).roots[0] for batch in read.batches(256)])
def passes(run):
    started = time.perf_counter()
    first = run()
    first_s = time.perf_counter() - started
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return first, first_s, float(np.median(seconds))
if __name__ == "__main__":
    import dask.bag as db
    import recjit.dask
    from distributed import Client, LocalCluster
    want, _, one_s = passes(one_process)
    run_s = passes(run_only)[2]
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \\
            Client(cluster):
        lines = db.read_text({path!r}, blocksize="300kB")
        def on_workers():
            return recjit.dask.roots(tree_lstm, lines, p, vocab=forest.vocab, threads=1).compute()
        got, first_s, dask_s = passes(on_workers)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    print(json.dumps({{"trees": int(forest.roots.size), "one process s": one_s,
                      "one process, trees read before s": run_s,
                      "dask 2 workers s": dask_s, "dask first pass s": first_s,
                      "partitions": lines.npartitions}}))
"""


def python(code, environment=None):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(environment or {})})


# What runs beside a latency loop as "the project's pytest -n 2": tests that keep both
# workers computing (hypothesis examples, kernels from the cache) for longer than the loop.
PYTEST_LOAD = ["-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
               "tests/test_fuzz_forests.py", "tests/test_zoo.py", "tests/test_gradients.py",
               "tests/test_schedule.py"]


def latency(module, model, trees, seconds):
    code = LATENCY.format(examples=EXAMPLES, module=module, model=model, trees=trees,
                          seconds=seconds)
    alone = json.loads(python(code).communicate()[0])
    pair = [python(code), python(code)]
    beside = json.loads(pair[0].communicate()[0])
    pair[1].communicate()
    rows = {"alone median ms": alone["median"], "alone p95 ms": alone["p95"],
            "after a 10 ms pause median ms": alone["after a pause"],
            "beside another process median ms": beside["median"],
            "beside another process p95 ms": beside["p95"]}
    for threads in (None, 1):
        loaded = beside_pytest(code, threads)
        label = "" if threads is None else ", 1 thread"
        rows[f"beside pytest -n 2{label} median ms"] = loaded["median"]
        rows[f"beside pytest -n 2{label} p95 ms"] = loaded["p95"]
    return rows


def beside_pytest(code, threads=None):
    """The latency loop while the project's tests run on both cores (`PYTEST_LOAD`), the
    kernels on `threads` threads (None: every core)."""
    load = subprocess.Popen([sys.executable, *PYTEST_LOAD], cwd=os.path.join(HERE, ".."),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its workers too, killed as a group
    try:
        time.sleep(6)  # the workers start and import
        if threads is not None:
            code = code.replace("model.run(forest, p)\ndef times",
                                f"rj.set_num_threads({threads})\nmodel.run(forest, p)\n"
                                "def times", 1)
        return json.loads(python(code).communicate()[0])
    finally:
        os.killpg(load.pid, signal.SIGKILL)
        load.wait()


def compiling(processes, then_load):
    """Each process's seconds and the resident memory its run added, `processes` at once,
    into a fresh empty cache; and with `then_load`, one more process's, which loads the
    kernel from it (else None)."""
    with tempfile.TemporaryDirectory() as cache:
        environment = {"RECJIT_CACHE_DIR": os.path.join(cache, "recjit"),
                       "NUMBA_CACHE_DIR": os.path.join(cache, "numba")}
        started = [python(COMPILE.format(examples=EXAMPLES), environment)
                   for _ in range(processes)]
        compiled = [json.loads(process.communicate()[0]) for process in started]
        if not then_load:
            return compiled, None
        loaded = json.loads(python(COMPILE.format(examples=EXAMPLES),
                                   environment).communicate()[0])
        return compiled, loaded


def corpus_throughput():
    """One process against `recjit.dask` with 2 workers over SST train, or why not."""
    path = os.path.join(HERE, "..", "..", "shared", "data", "sst", "train.txt")
    if not os.path.exists(path):
        return {"absent": f"no SST train at {os.path.normpath(path)}"}
    with tempfile.TemporaryDirectory() as scratch:
        script = os.path.join(scratch, "corpus.py")  # a file: Dask's workers are spawned
        with open(script, "w") as handle:
            handle.write(CORPUS.format(examples=EXAMPLES, path=os.path.abspath(path)))
        process = subprocess.run([sys.executable, script], capture_output=True, text=True,
                                 check=False)
    if process.returncode:
        return {"absent": process.stderr.strip().splitlines()[-1]}
    return json.loads(process.stdout)


def markdown(results):
    lines = [f"# recjit on a shared machine: {results['machine']}", "",
             "Beside pytest -n 2: " + " ".join(PYTEST_LOAD[5:]) + ", started 6 s before.", ""]
    for name, row in results["latency"].items():
        lines += [f"## {name}", ""] + [f"- {key}: {value:.2f}" for key, value in row.items()]
        lines.append("")
    (one,), loaded = results["compile one process"]
    four = ", ".join(f"{run['s']:.1f}" for run in results["compile four processes"][0])
    lines += ["## compiling TreeGRU into an empty cache", "",
              f"- one process: {one['s']:.1f} s",
              f"- four at once: {four} s",
              (f"- the resident memory the process's first run added, compiling its kernel "
               f"and the runtime's products: {one['resident MB']:.0f} MB; loading them from "
               f"the cache, the next process: {loaded['resident MB']:.0f} MB (docs/memory.md)"),
              ""]
    corpus = results["corpus"]
    lines += ["## TreeLSTM h150 over SST train, batches of 256", ""]
    if "absent" in corpus:
        lines.append(f"- not measured: {corpus['absent']}")
    else:
        trees = corpus["trees"]
        lines += [(f"- one process, reading the file: {corpus['one process s']:.2f} s "
                   f"({trees / corpus['one process s']:.0f} trees/s); the trees read before: "
                   f"{corpus['one process, trees read before s']:.2f} s"),
                  (f"- recjit.dask, 2 workers of 1 thread, {corpus['partitions']} partitions: "
                   f"{corpus['dask 2 workers s']:.2f} s "
                   f"({trees / corpus['dask 2 workers s']:.0f} trees/s); first pass "
                   f"{corpus['dask first pass s']:.2f} s")]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--machine", default=f"cpu-{os.cpu_count()}core")
    args = parser.parse_args()
    seconds = 2 if args.quick else 6
    results = {"machine": args.machine, "latency": {
        "TreeLSTM h256, 10 trees": latency("tree_lstm", "tree_lstm", 10, seconds),
        "TreeRNN h256, 1 tree": latency("tree_rnn", "tree_rnn", 1, seconds)}}
    results["compile one process"] = compiling(1, then_load=True)
    results["compile four processes"] = compiling(4, then_load=False)
    results["corpus"] = corpus_throughput()
    base = os.path.join(HERE, "results", f"machine-{args.machine}")
    print(markdown(results))
    write_results(base, results, markdown(results))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
