"""recjit.dask runs a model over a corpus partitioned across the worker processes of a
`distributed` cluster: the same root states as one process, each kernel compiled once a
worker."""
import os

import numpy as np
import pytest

import recjit as rj
from common import SST_TEST
from tree_rnn import make_params, tree_rnn

dask_bag = pytest.importorskip("dask.bag")
distributed = pytest.importorskip("distributed")
rjd = pytest.importorskip("recjit.dask")

SST_TRAIN = os.path.join(os.path.dirname(SST_TEST), "train.txt")
needs_sst = pytest.mark.skipif(not os.path.exists(SST_TRAIN), reason="no SST data")


@pytest.fixture(scope="module")
def client():
    """Two worker processes of one thread each, as on a 2-core machine."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as connected:
        yield connected


@pytest.fixture(scope="module")
def sst_train():
    with open(SST_TRAIN) as lines:
        return rj.Forest.from_ptb(lines)


def one_process_roots(model, forest, p, batch_size=256):
    return np.concatenate([model.run(batch, p).roots[0] for batch in forest.batches(batch_size)])


@needs_sst
def test_roots_of_sst_train_on_two_workers_are_one_process_roots(client, sst_train):
    p = make_params(16, len(sst_train.vocab), "float64", seed=3)
    lines = dask_bag.read_text(SST_TRAIN, blocksize="300kB")
    assert lines.npartitions > 2
    states = rjd.roots(tree_rnn, lines, p, vocab=sst_train.vocab, threads=1)
    assert np.isnan(states.shape[0]) and states.shape[1:] == (16,) and states.dtype == np.float64
    got = states.compute()
    np.testing.assert_allclose(got, one_process_roots(tree_rnn, sst_train, p), rtol=1e-12,
                               atol=1e-14)


def test_each_worker_compiles_a_notebook_model_once_for_every_partition_and_computation(
        client):
    @rj.recursive_model(arity=2)
    def local_rnn(node, p):  # defined in a function: shipped by value, as a notebook's is
        if node.is_leaf:
            return p.E[node.word]
        return rj.tanh(p.W @ (local_rnn(node.left, p) + local_rnn(node.right, p)))

    rng = np.random.default_rng(0)
    p = rj.Params(E=rng.normal(size=(40, 6)), W=rng.normal(size=(6, 6)) / 3)
    forests = [rj.Forest.random_binary(20, seed=seed, vocab_size=40) for seed in range(8)]
    for _ in range(2):
        got = rjd.roots(local_rnn, forests, p, threads=1).compute()
        np.testing.assert_allclose(got, np.concatenate(
            [local_rnn.reference(forest, p).roots[0] for forest in forests]), rtol=1e-10)
    counts = [count for held in client.run(rjd.resident).values()
              for name, count in held.items() if name.startswith("local_rnn#")]
    assert counts == [1, 1]


def test_to_npy_writes_each_partitions_root_states_to_a_file_in_corpus_order(client, tmp_path):
    p = make_params(8, 30, "float64", seed=1)
    forests = [rj.Forest.random_binary(size, seed=size, vocab_size=30) for size in (5, 1, 7)]
    paths = rjd.to_npy(tree_rnn, forests, p, str(tmp_path), batch_size=2)
    assert [os.path.basename(path) for path in paths] == [
        "part-00000.npy", "part-00001.npy", "part-00002.npy"]
    for path, forest in zip(paths, forests):
        np.testing.assert_allclose(np.load(path), tree_rnn.reference(forest, p).roots[0],
                                   rtol=1e-10)


def test_a_word_outside_the_shared_vocab_is_an_error_naming_it(client):
    p = make_params(8, 3, "float64")
    lines = dask_bag.from_sequence(["(1 (2 good) (3 film))", "(0 (1 dull) (2 film))"],
                                   npartitions=2)
    vocab = {"good": 0, "film": 1, "fine": 2}
    with pytest.raises(rj.InputError, match="partition 1 of the corpus .from 0.: word 'dull' "
                                            "is not in vocab"):
        rjd.roots(tree_rnn, lines, p, vocab=vocab).compute()


def test_a_line_that_is_not_a_tree_is_an_error_naming_its_partition_and_line(client):
    lines = dask_bag.from_sequence(["(1 (2 good) (3 film))", "(2 film)", "(0 (1 dull)"],
                                   npartitions=2)
    assert lines.map_partitions(len).compute() == [2, 1]
    with pytest.raises(rj.InputError, match="partition 1 of the corpus .from 0.: PTB line 1: "
                                            "unbalanced brackets"):
        rjd.roots(tree_rnn, lines, make_params(8, 3, "float64"),
                  vocab={"good": 0, "film": 1, "dull": 2}).compute()


def test_unknown_gives_the_id_words_outside_the_vocab_are_read_as(client):
    p = make_params(8, 3, "float64")
    lines = dask_bag.from_sequence(["(1 (2 good) (3 film))", "(0 (1 dull) (2 film))"],
                                   npartitions=2)
    vocab = {"good": 0, "film": 1, "<unk>": 2}
    got = rjd.roots(tree_rnn, lines, p, vocab=vocab, unknown=2).compute()
    want = tree_rnn.reference(rj.Forest.from_nested([(0, 1), (2, 1)]), p).roots[0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_bag_of_lines_without_a_vocab_is_refused_before_anything_runs():
    lines = dask_bag.from_sequence(["(1 (2 good) (3 film))"])
    with pytest.raises(rj.InputError, match="vocab="):
        rjd.roots(tree_rnn, lines, make_params(8, 3, "float64"))


@pytest.mark.parametrize("option, message", [
    ({"backend": "gpu"}, "backend must be one of"),
    ({"schedule": "fast"}, "schedule must be a recjit.Schedule"),
], ids=["backend", "schedule"])
def test_a_backend_or_schedule_that_cannot_run_is_refused_before_anything_runs(option,
                                                                               message):
    forests = [rj.Forest.random_binary(2, seed=0, vocab_size=5)]
    with pytest.raises(rj.RecJitError, match=message):
        rjd.roots(tree_rnn, forests, make_params(8, 5, "float64"), **option)


def test_an_output_the_model_does_not_return_is_refused_before_anything_runs():
    forests = [rj.Forest.random_binary(2, seed=0, vocab_size=5)]
    with pytest.raises(rj.RecJitError, match="output=1: tree_rnn returns 1 state"):
        rjd.roots(tree_rnn, forests, make_params(8, 5, "float64"), output=1)


def test_to_npy_into_a_path_that_is_a_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "states"
    path.write_text("")
    forests = [rj.Forest.random_binary(2, seed=0, vocab_size=5)]
    with pytest.raises(rj.InputError, match="directory .*states', which is a file"):
        rjd.to_npy(tree_rnn, forests, make_params(8, 5, "float64"), str(path))
