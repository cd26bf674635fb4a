#!/usr/bin/env bash
# What a GPU session carries to the device machine, which reaches no package registry and no
# ../shared. Run it here, from the repository root, before the session's first call:
#     tools/gpu_inputs.sh [PYTHON_VERSION (default 3.12)] [TREES (default ../shared/data/sst/test.txt)]
# then call the device with carry=[".whl", ".gpu"]; tools/gpu_session.sh installs every wheel
# in .whl first and reads the trees from .gpu/test.txt.
# - .whl/numpy-2.2.6: the image's NumPy (2.5) lacks np.row_stack, which numba-cuda 0.30
#   registers at import, so every CUDA compile fails without an older one;
# - .whl/dyNET38: DyNet, the benchmark's peer that the image lacks (every GPU results file
#   before this one has it absent). It needs NumPy at run time only.
# Both folders are ignored by git.
set -eu
version=${1:-3.12}
trees=${2:-../shared/data/sst/test.txt}
mkdir -p .whl .gpu
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$version" \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    numpy==2.2.6 dynet38
cp -f "$trees" .gpu/test.txt
head -n 400 "$(dirname "$trees")/train.txt" > .gpu/train.txt  # the training stage's batches
# The tests no GPU has passed yet, which the cuda-tests stage runs first.
python=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
"$python" tools/gpu_pending_tests.py --out .gpu/pending-tests.txt
ls -l .whl .gpu
