"""Models cross process boundaries (process pools, Dask, Ray): a model defined in a module
pickles as a reference to it; a notebook cell's, by value with cloudpickle, its source
included, so that another process can analyse and compile it. Compiled kernels stay behind."""
import copy
import linecache
import multiprocessing
import pickle
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import recjit as rj
from tree_lstm import make_params, tree_lstm

cloudpickle = pytest.importorskip("cloudpickle")

CELL = '''
import recjit as rj

def mix(left, right, p):
    return rj.tanh(p.W @ (left + right))

@rj.recursive_model(arity=2)
def notebook_rnn(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return mix(notebook_rnn(node.left, p), notebook_rnn(node.right, p), p)
'''

LOAD_AND_RUN = """
import pickle, sys
import numpy as np
import recjit as rj
model = pickle.loads(sys.stdin.buffer.read())
forest = rj.Forest.random_binary(3, seed=0, mean_leaves=5, vocab_size=6)
rng = np.random.default_rng(0)
p = rj.Params(E=rng.normal(size=(6, 4)), W=rng.normal(size=(4, 4)) / 2)
sys.stdout.buffer.write(pickle.dumps(model.run(forest, p).nodes[0]))
"""


SCRIPT_WITH_A_POOL = """
import sys
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
import numpy as np
import recjit as rj

@rj.recursive_model(arity=2)
def script_rnn(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return rj.tanh(p.W @ (script_rnn(node.left, p) + script_rnn(node.right, p)))

if __name__ == "__main__":
    forest = rj.Forest.random_binary(3, seed=0, mean_leaves=5, vocab_size=6)
    rng = np.random.default_rng(0)
    p = rj.Params(E=rng.normal(size=(6, 4)), W=rng.normal(size=(4, 4)) / 2)
    context = multiprocessing.get_context(sys.argv[1])
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        states = pool.submit(script_rnn.run, forest, p).result().nodes[0]
    assert np.array_equal(states, script_rnn.run(forest, p).nodes[0])
    print("equal")
"""


def notebook_cell(source, filename="<ipython-input-1-recjit>"):
    """Run `source` as IPython runs a cell: its text in linecache, under the cell's name."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def test_a_model_defined_in_a_module_pickles_as_a_reference_to_it():
    tree_lstm.run(rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=20),
                  make_params(4, 20, "float64", 0))  # compiled kernels and a lock to leave
    data = pickle.dumps(tree_lstm)
    assert pickle.loads(data) is tree_lstm
    assert b"tree_lstm" in data and len(data) < 200


def runs_in_another_process(model, dumps):
    """Whether `model`, pickled by `dumps`, gives its own states in a process that has never
    seen its source."""
    forest = rj.Forest.random_binary(3, seed=0, mean_leaves=5, vocab_size=6)
    rng = np.random.default_rng(0)
    p = rj.Params(E=rng.normal(size=(6, 4)), W=rng.normal(size=(4, 4)) / 2)
    expected = model.run(forest, p).nodes[0]
    result = subprocess.run([sys.executable, "-c", LOAD_AND_RUN],
                            input=dumps(model), capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    np.testing.assert_allclose(pickle.loads(result.stdout), expected, rtol=1e-12)
    return True


@pytest.mark.parametrize("dumps", [cloudpickle.dumps, pickle.dumps],
                         ids=["cloudpickle", "pickle"])
def test_a_notebook_cells_model_runs_in_another_process_after_pickling(dumps):
    """With the helper it calls: both sources travel with it. Plain pickle (and so
    `torch.save` of a module holding it) takes it by value too."""
    assert runs_in_another_process(notebook_cell(CELL)["notebook_rnn"], dumps)


def test_a_model_local_to_a_function_runs_in_another_process_after_pickle():
    def build():
        @rj.recursive_model(arity=2)
        def local_rnn(node, p):
            if node.is_leaf:
                return p.E[node.word]
            return rj.tanh(p.W @ (local_rnn(node.left, p) + local_rnn(node.right, p)))
        return local_rnn

    assert runs_in_another_process(build(), pickle.dumps)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_scripts_model_runs_in_the_process_pool_the_script_starts(tmp_path, start):
    """multiprocessing pickles it as a reference to the script, which its processes run."""
    script = tmp_path / "script_with_a_pool.py"
    script.write_text(SCRIPT_WITH_A_POOL)
    result = subprocess.run([sys.executable, str(script), start], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "equal"


def test_a_copy_of_a_model_is_the_model_itself():
    """As for a function: its cell calls the model by name, so a second model would see
    the first one called from its cell."""
    model = notebook_cell(CELL, "<ipython-input-3-recjit>")["notebook_rnn"]
    assert copy.copy(model) is model
    assert copy.deepcopy(model) is model


def test_a_model_pickled_by_value_and_loaded_is_a_new_model_whose_cell_calls_itself():
    model = notebook_cell(CELL, "<ipython-input-2-recjit>")["notebook_rnn"]
    loaded = pickle.loads(pickle.dumps(model))
    assert loaded is not model
    assert loaded.function.__globals__["notebook_rnn"] is loaded


def test_a_runs_result_pickles_with_its_nodes_in_the_forests_order():
    """As a process pool's worker returns it: the nodes are put in order first."""
    forest = rj.Forest.random_binary(3, seed=1, mean_leaves=4, vocab_size=20)
    result = tree_lstm.run(forest, make_params(4, 20, "float64", 0))
    copied = pickle.loads(pickle.dumps(result))
    for got, expected in zip(copied.nodes + copied.roots, result.nodes + result.roots,
                             strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_process_pools_workers_return_the_results_of_runs():
    forest = rj.Forest.random_binary(2, seed=2, mean_leaves=4, vocab_size=20)
    p = make_params(4, 20, "float64", 0)
    expected = tree_lstm.run(forest, p)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(tree_lstm.run, [forest, forest], [p, p]))
    for result in results:
        np.testing.assert_array_equal(result.nodes[0], expected.nodes[0])


def test_pickling_a_pullback_is_refused_saying_what_to_send_instead():
    forest = rj.Forest.random_binary(2, seed=1, mean_leaves=4, vocab_size=20)
    out, pullback = tree_lstm.vjp(forest, make_params(4, 20, "float64", 0))
    with pytest.raises(rj.RecJitError, match="send its Gradients"):
        pickle.dumps(pullback)
    gradients = pullback(roots=(np.ones_like(out.roots[0]), None))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(gradients)).params.U_iou,
                                  gradients.params.U_iou)


def words_forest(vocab, line="(3 (2 good) (1 movie))"):
    return rj.Forest.from_ptb([line], vocab=vocab)


def test_forests_sent_one_at_a_time_with_one_vocabulary_arrive_sharing_it():
    """As a DataLoader's worker sends its batches: the vocabulary is loaded once, and
    `Forest.concat` of the batches finds it the same dict."""
    vocab = {f"word{k}": k for k in range(1000)}
    forests = [words_forest(vocab, line)
               for line in ("(3 (2 good) (1 movie))", "(1 (2 bad) (1 film))")]
    first, second = (pickle.loads(pickle.dumps(forest)) for forest in forests)
    assert first.vocab is second.vocab and first.vocab == vocab
    assert rj.Forest.concat([first, second]).vocab is first.vocab


def test_a_vocabulary_is_pickled_once_while_it_keeps_its_words(monkeypatch):
    from recjit.linearize import vocabularies
    made, make = [], vocabularies.Pickled
    monkeypatch.setattr(vocabularies, "Pickled",
                        lambda vocabulary: made.append(vocabulary) or make(vocabulary))
    vocab = {}
    forest = words_forest(vocab)
    pickle.dumps(forest)
    pickle.dumps(forest)
    assert len(made) == 1
    words_forest(vocab, "(1 (2 bad) (1 film))")
    pickle.dumps(forest)
    assert len(made) == 2


def test_a_vocabulary_extended_between_two_sends_arrives_extended():
    vocab = {}
    forest = words_forest(vocab)
    before = pickle.loads(pickle.dumps(forest)).vocab
    words_forest(vocab, "(1 (2 bad) (1 film))")
    after = pickle.loads(pickle.dumps(forest)).vocab
    assert after == vocab and len(before) == 2 and len(after) == 4


def test_a_copy_of_a_forest_shares_its_vocabulary_and_a_deep_copy_has_its_own():
    vocab = {}
    forest = words_forest(vocab)
    assert copy.copy(forest).vocab is vocab
    deep = copy.deepcopy(forest)
    assert deep.vocab == vocab and deep.vocab is not vocab
