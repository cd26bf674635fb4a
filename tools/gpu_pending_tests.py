"""The tests of the GPU session's `cuda-tests` stage that no GPU has passed yet, by the logs in
benchmarks/results (`*cuda-tests*.log`), written one test id a line for the stage to run first
(`RECJIT_TESTS_FIRST`, tests/conftest.py). A call on a GPU is at most 600 s and a backward
test's first compile there takes 40-250 s, so the tests that have run before wait their turn.

    python tools/gpu_pending_tests.py [--out .gpu/pending-tests.txt]
    python tools/gpu_pending_tests.py --files    # the stage's test files, which it runs

Collects with numba's simulator, as the suite does without a GPU: the same test ids."""
import argparse
import glob
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
# The `cuda-tests` stage's test files (tools/gpu_session.sh runs what `--files` prints).
STAGE_FILES = ("tests/test_cuda_backward.py", "tests/test_cuda.py", "tests/test_cuda_runtime.py",
               "tests/test_context.py", "tests/test_schedule.py", "tests/test_ieee_semantics.py",
               "tests/test_prepare.py", "tests/test_torch_layer.py")
TEST_ID = r"tests/[\w/]+\.py::\w+(?:\[[^\]\n]*\])?"  # parameters may hold spaces
PASSED = re.compile(rf"PASSED ({TEST_ID})|({TEST_ID}) PASSED")


def collected():
    """The stage's test ids, in collection order."""
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *STAGE_FILES], cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"})
    return [line for line in listing.stdout.splitlines() if "::" in line]


def passed_on_a_gpu():
    """Every test id a results log shows passed."""
    ids = set()
    for path in glob.glob(os.path.join(ROOT, "benchmarks", "results", "*cuda-tests*.log")):
        with open(path) as log:
            for found in PASSED.finditer(log.read()):
                ids.add(found.group(1) or found.group(2))
    return ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, ".gpu", "pending-tests.txt"))
    parser.add_argument("--files", action="store_true",
                        help="print the stage's test files and nothing else")
    args = parser.parse_args()
    if args.files:
        print(" ".join(STAGE_FILES))
        return
    done, stage = passed_on_a_gpu(), collected()
    pending = [test for test in stage if test not in done]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        out.write("".join(f"{test}\n" for test in pending))
    print(f"{len(pending)} tests no GPU has passed yet, of the stage's "
          f"{len(stage)}: {args.out}")


if __name__ == "__main__":
    main()
