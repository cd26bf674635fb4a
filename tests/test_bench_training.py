"""The training benchmark's parts that are not timings. Its GPU contestant is the CPU one's
step: `RecjitCudaStep`, its parameters in one flat device buffer and Adagrad on the device,
takes the steps that `RecjitStep` takes on the host (numba's simulator, float64). The work it
divides each target's allowed time into is the model's own multiply-adds."""
import os
import sys

import numpy as np

import recjit as rj
from train_sst import initial_parameters

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_training import (EPSILON, RecjitCudaStep, RecjitStep, adagrad_rows,  # noqa: E402
                            necessary_work, traced_peak)

TREES = ["(3 (2 (1 a) (3 b)) (4 (2 c) (3 d)))", "(1 (0 (1 e) (2 f)) (2 g))", "(2 h)",
         "(4 (3 (3 a) (4 (2 b) (4 i))) (2 j))"]


def test_the_gpu_step_takes_the_cpu_steps_losses_and_parameters():
    vocab = {}
    batches = [rj.Forest.from_ptb(TREES[:2], vocab=vocab),
               rj.Forest.from_ptb(TREES[2:], vocab=vocab)]
    initial = initial_parameters(len(vocab), 4, 3, seed=0, dtype="float64")
    on_host, on_gpu = RecjitStep(initial), RecjitCudaStep(initial)
    for forest in batches * 2:
        np.testing.assert_allclose(on_gpu(forest), on_host(forest), rtol=1e-10)
    for name, value in on_host.params.items():
        np.testing.assert_allclose(getattr(on_gpu.on_device, name).copy_to_host(), value,
                                   rtol=1e-10, atol=1e-12)
    assert not np.array_equal(on_host.params["U_iou"], initial["U_iou"])


def test_a_steps_necessary_work_counts_a_distinct_words_leaf_product_once():
    """Four leaves of three words, three internal nodes, six edges; X=4, H=3: W_iou x a
    distinct word, U_iou h̃ an internal node, U_f h_k an edge, the classifier's 5 × H a
    node; the forward's products three times (the backward's Wᵀg and g xᵀ), the
    classifier's too."""
    vocab = {}
    forest = rj.Forest.from_ptb(["(3 (2 (1 a) (3 b)) (4 (2 c) (3 a)))"], vocab=vocab)
    initial = initial_parameters(len(vocab), 4, 3, seed=0)
    forward = 2 * (3 * 9 * 4 + 3 * 9 * 3 + 6 * 3 * 3)
    work = necessary_work([forest], initial)
    assert np.isclose(work["step GFLOP"] * 1e9, 3 * forward + 3 * 2 * 5 * 3 * 7)
    assert np.isclose(work["per-tree gradients GFLOP"] * 1e9, 2 * forward)
    per_leaf = forward + 2 * 9 * 4  # the second leaf of word a, its own product
    assert np.isclose(work["jacobian GFLOP"] * 1e9, 3 * per_leaf)


def test_the_recjit_steps_adagrad_gives_numpys_bits():
    """The step's Adagrad is a numba loop a parameter: NumPy's arithmetic in NumPy's order,
    on every element of a dense parameter and on a table's gathered rows."""
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        value, squares = rng.normal(size=(7, 5)).astype(dtype), rng.random((7, 5)).astype(dtype)
        gradient = rng.normal(size=(7, 5)).astype(dtype)
        expected_squares = squares + gradient * gradient
        expected = value - 0.05 * gradient / (np.sqrt(expected_squares) + EPSILON)
        RecjitStep.adagrad(value, squares, gradient, 0.05)
        assert np.array_equal(squares, expected_squares) and np.array_equal(value, expected)

        rows = np.array([1, 4, 6])
        expected_squares[rows] += gradient[:3] * gradient[:3]
        expected[rows] -= 0.1 * gradient[:3] / (np.sqrt(expected_squares[rows]) + EPSILON)
        adagrad_rows(value, squares, rows, gradient[:3], dtype(0.1), dtype(EPSILON))
        assert np.array_equal(squares, expected_squares) and np.array_equal(value, expected)


def test_a_measured_peak_counts_what_a_call_holds_at_once_and_not_its_first_call():
    """A call that holds two 1 MB arrays at once, then drops one for a third, peaks at 2 MB;
    its first call (which compiles, in the benchmark; here it holds 80 MB) is not measured."""
    calls = []

    def call():
        calls.append(None)
        if len(calls) == 1:
            np.zeros(10**7)  # 80 MB, held by the first call only
        first, second = np.ones(125_000), np.ones(125_000)
        del first
        return second + 1

    peak = traced_peak(call)
    assert len(calls) == 2
    assert 2_000_000 <= peak < 2_100_000
