"""The threads recjit's CPU kernels run on: a count the user sets, one where that has been
faster lately, and GNU OpenMP's spinning at a barrier shortened unless the user chose it."""
import os
import subprocess
import sys

import numpy as np
import pytest

import recjit as rj
from recjit.codegen_cpu.launch import ThreadChoice
from tree_rnn import make_params, tree_rnn

from conftest import assert_same_gradients
from test_gradients import VOCAB, pullback_and_cotangents


def test_a_run_on_one_thread_gives_the_same_states():
    forest = rj.Forest.random_binary(4, seed=0, mean_leaves=6, vocab_size=20)
    p = make_params(8, 20, "float64", 0)
    expected = tree_rnn.run(forest, p).nodes[0]
    before = rj.get_num_threads()
    rj.set_num_threads(1)
    try:
        assert rj.get_num_threads() == 1
        np.testing.assert_array_equal(tree_rnn.run(forest, p).nodes[0], expected)
    finally:
        rj.set_num_threads(before)


def test_a_vjp_on_one_thread_gives_the_same_states_and_gradients_bit_for_bit(monkeypatch):
    """The threads share a kernel's rows and its weight products' rows, never a sum: on one
    thread or all of them, the same bits, in a forest large enough that the products read
    packed weights."""
    monkeypatch.setattr(ThreadChoice, "threads", lambda self, size, most: most)
    forest = rj.Forest.random_binary(4, seed=3, vocab_size=VOCAB)
    assert forest.num_nodes >= rj.Schedule().pack_from_nodes
    p = make_params(128, VOCAB, "float64", 2)
    results = []
    before = rj.get_num_threads()
    for count in (before, 1):
        rj.set_num_threads(count)
        try:
            pullback, roots, nodes = pullback_and_cotangents(tree_rnn, forest, p, 5)
            results.append((tree_rnn.run(forest, p).nodes[0], pullback(roots=roots, nodes=nodes)))
        finally:
            rj.set_num_threads(before)
    (states, gradients), (one_thread_states, one_thread_gradients) = results
    np.testing.assert_array_equal(one_thread_states, states)
    assert_same_gradients(one_thread_gradients, gradients, rtol=0, atol=0)


def choices(choice, size, most, seconds_on, calls):
    """The thread counts `choice` picks for `calls` calls, each taking `seconds_on[count]`."""
    picked = []
    for _ in range(calls):
        threads = choice.threads(size, most)
        choice.took(size, threads, seconds_on[threads])
        picked.append(threads)
    return picked


def test_a_thread_choice_tries_both_counts_then_keeps_the_faster_probing_the_other():
    tries = 2 * ThreadChoice.TRIES
    picked = choices(ThreadChoice(), 100, 2, {2: 1.0, 1: 2.0}, 66)
    assert picked[:tries] == [2, 1] * ThreadChoice.TRIES
    assert picked[tries:].count(1) == 2 and picked[ThreadChoice.PROBE - 1] == 1  # the probes


def test_a_thread_choice_moves_to_one_thread_when_all_become_slow():
    choice = ThreadChoice()
    choices(choice, 100, 2, {2: 1.0, 1: 2.0}, 10)
    assert choices(choice, 100, 2, {2: 5.0, 1: 2.0}, 10)[-5:] == [1] * 5


def test_a_thread_choice_is_not_held_by_one_slow_call():
    choice = ThreadChoice()
    choice.took(100, 2, 100.0)  # the first call on all the threads, ten times as long
    picked = choices(choice, 100, 2, {2: 1.0, 1: 2.0}, 20)
    assert picked[-10:] == [2] * 10


def test_a_thread_choice_keeps_each_size_class_apart_and_one_thread_when_allowed_one():
    choice = ThreadChoice()
    choices(choice, 10, 2, {2: 5.0, 1: 1.0}, 10)
    tries = 2 * ThreadChoice.TRIES
    assert choices(choice, 1000, 2, {2: 1.0, 1: 5.0}, tries + 3)[tries:] == [2, 2, 2]
    assert choices(choice, 10, 1, {1: 1.0}, 3) == [1, 1, 1]


@pytest.mark.parametrize("count", [0, 10 ** 6, 1.5, True])
def test_a_thread_count_outside_numbas_pool_is_refused_naming_the_limit(count):
    with pytest.raises(rj.RecJitError, match="NUMBA_NUM_THREADS"):
        rj.set_num_threads(count)


def test_a_thread_count_may_be_a_numpy_integer():
    before = rj.get_num_threads()
    try:
        rj.set_num_threads(np.int64(1))
        assert rj.get_num_threads() == 1
    finally:
        rj.set_num_threads(before)


@pytest.mark.parametrize("given, expected", [(None, "1000"), ("50000", "50000")],
                         ids=["unset", "the user's"])
def test_import_recjit_shortens_openmps_spinning_unless_the_user_set_it(given, expected):
    environment = {key: value for key, value in os.environ.items() if key != "GOMP_SPINCOUNT"}
    if given is not None:
        environment["GOMP_SPINCOUNT"] = given
    code = "import os, recjit; print(os.environ['GOMP_SPINCOUNT'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=environment)
    assert result.stdout.strip() == expected


FORKED = """
import concurrent.futures, multiprocessing, sys
sys.path.insert(0, 'examples')
import numpy as np
import recjit as rj
from recjit.codegen_cpu.launch import ThreadChoice
from tree_rnn import make_params, tree_rnn

forest = rj.Forest.random_binary(3, seed=0, mean_leaves=5, vocab_size=20)
p = make_params(4, 20, 'float64', 0)


def states_and_gradient(_):
    out, pullback = tree_rnn.vjp(forest, p)
    return out.nodes[0], pullback(roots=np.ones_like(out.roots[0])).params.W
"""


FORKED_PRODUCTS = """
import concurrent.futures, multiprocessing
import numpy as np
from recjit.codegen_cpu import calls, sum_of_outer_products

rng = np.random.default_rng(0)
many = rng.normal(size=(2 * calls.WEIGHT_GRADIENT_CHUNK + 300, 20)), rng.normal(size=(
    2 * calls.WEIGHT_GRADIENT_CHUNK + 300, 50))  # in chunks
aliased = rng.normal(size=(calls.APART_FROM_ROWS, 20)), rng.normal(size=(
    calls.APART_FROM_ROWS, 128))  # b's rows 1 KiB apart: read from a copy


def products(_):
    calls.export(np.float64)
    ys = [np.empty((b.shape[1], a.shape[1])) for a, b in (many, aliased)]
    for (a, b), y in zip((many, aliased), ys):
        sum_of_outer_products(a, b, y, 32)
    return ys
"""


PARENT_THEN_FORKED_CHILD = """


if __name__ == '__main__':
    expected = {call}(None)  # the parent's calls start OpenMP's threads
    context = multiprocessing.get_context('fork')
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        got = pool.submit({call}, None).result(timeout=240)
    print(max(float(np.abs(g - e).max()) for g, e in zip(got, expected)))
"""


def forked_difference(script, call):
    """The largest difference between the arrays that function `call` of `script` returns
    in a process of its own and in a child it forks after that, which must end without an
    error."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    program = script + PARENT_THEN_FORKED_CHILD.format(call=call)
    result = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return float(result.stdout.split()[-1])


def test_a_process_forked_after_a_run_sums_weight_gradients_in_chunks_and_rows_apart():
    """The backward's host products that take more than one parallel function (MV-RNN's W_M
    over many nodes, rows that lie in few cache sets) each run serially in the child too: a
    parallel one called from another's serial twin killed the child."""
    assert forked_difference(FORKED_PRODUCTS, "products") <= 1e-12


def test_a_process_forked_after_a_run_runs_models_and_their_gradients():
    """multiprocessing's default on Linux, and a DataLoader worker's: the child runs each
    kernel compiled serially, where numba would have killed it, and gets the parent's
    results up to rounding (a serial twin is compiled apart, with fast math)."""
    assert forked_difference(FORKED, "states_and_gradient") <= 1e-12
