"""recjit where users run it (docs/threads.md, docs/processes.md): latency back to back, after
a pause, and beside another process; and compiling one kernel in several processes at once.

    python benchmarks/bench_machine.py [--quick] [--machine NAME]

- Latency, TreeLSTM h256 on 10 trees and TreeRNN h256 on 1 tree, float32: median and 95th
  percentile back to back; median with a 10 ms pause before each call (threads asleep, the
  weights cold); median and 95th percentile while a second process runs the same loop.
- Compiling: TreeGRU into an empty cache in one process, then in four at once (each process's
  wall time, the import included).

Writes benchmarks/results/machine-<machine>.json and .md. A benchmark, never a test."""
import argparse
import json
import os
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
import sys, time
started = time.perf_counter()
sys.path.insert(0, {examples!r})
import recjit as rj
from tree_gru import make_params, tree_gru
tree_gru.run(rj.Forest.random_binary(3, seed=0, vocab_size=20), make_params(7, 20, "float64"))
print(time.perf_counter() - started)
"""


def python(code, environment=None):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(environment or {})})


def latency(module, model, trees, seconds):
    code = LATENCY.format(examples=EXAMPLES, module=module, model=model, trees=trees,
                          seconds=seconds)
    alone = json.loads(python(code).communicate()[0])
    pair = [python(code), python(code)]
    beside = json.loads(pair[0].communicate()[0])
    pair[1].communicate()
    return {"alone median ms": alone["median"], "alone p95 ms": alone["p95"],
            "after a 10 ms pause median ms": alone["after a pause"],
            "beside another process median ms": beside["median"],
            "beside another process p95 ms": beside["p95"]}


def compiling(processes):
    """Each process's seconds, `processes` at once, into a fresh empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        environment = {"RECJIT_CACHE_DIR": os.path.join(cache, "recjit"),
                       "NUMBA_CACHE_DIR": os.path.join(cache, "numba")}
        started = [python(COMPILE.format(examples=EXAMPLES), environment)
                   for _ in range(processes)]
        return [float(process.communicate()[0]) for process in started]


def markdown(results):
    lines = [f"# recjit on a shared machine: {results['machine']}", ""]
    for name, row in results["latency"].items():
        lines += [f"## {name}", ""] + [f"- {key}: {value:.2f}" for key, value in row.items()]
        lines.append("")
    one, four = results["compile one process s"], results["compile four processes s"]
    lines += ["## compiling TreeGRU into an empty cache", "",
              f"- one process: {one[0]:.1f} s",
              f"- four at once: {', '.join(f'{s:.1f}' for s in four)} s"]
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
    results["compile one process s"] = compiling(1)
    results["compile four processes s"] = compiling(4)
    base = os.path.join(HERE, "results", f"machine-{args.machine}")
    print(markdown(results))
    write_results(base, results, markdown(results))


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
