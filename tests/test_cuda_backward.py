"""`vjp(backend="cuda")`: the backward kernel generated, planned and launched as the forward's
(`codegen_cuda.backward`) gives the CPU's gradients, for every model of the zoo, fused and
unfused; in numba's simulator without a GPU (grids of several blocks: test_cuda_grid.py)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import recjit as rj
from dag_rnn import dag_rnn, grids, make_params as dag_rnn_params
from recjit.autodiff import Pullback
from recjit.codegen_cuda import device
from recjit.lowering.backward import gradient_sums
from tree_lstm import make_params as tree_lstm_params, tree_lstm

from conftest import cotangents, seeds
from test_gradients import HIDDEN, VOCAB, ZOO, assert_same_gradients, fielded, fielded_params

FUSED, UNFUSED = rj.Schedule(), rj.Schedule(fusion=False)
FOREST = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (0, 1)])


def gradients_on_both(model, forest, p, seed, schedule=None, per_tree=False):
    """(the GPU's gradients, the CPU's) for the same random cotangents on roots and nodes, once
    the two forward runs are checked equal."""
    out, cpu = model.vjp(forest, p, schedule=schedule)
    gpu_out, gpu = model.vjp(forest, p, schedule=schedule, backend="cuda")
    for got, expected in zip(gpu_out.nodes, out.nodes):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    roots = cotangents([state.shape for state in out.roots], seed)
    nodes = cotangents([state.shape for state in out.nodes], seed + 1)
    return (gpu(roots=roots, nodes=nodes, per_tree=per_tree),
            cpu(roots=roots, nodes=nodes, per_tree=per_tree))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", sorted(ZOO))
@settings(max_examples=1, deadline=None)
@given(data=st.data(), seed=seeds)
def test_a_zoo_models_gradients_on_the_gpu_are_the_cpus(name, schedule, data, seed):
    model, make, forests = ZOO[name]
    assert_same_gradients(*gradients_on_both(model, data.draw(forests),
                                             make(HIDDEN, VOCAB, "float64", seed % 7), seed,
                                             schedule))


def test_a_dag_models_gradients_on_the_gpu_are_the_cpus():
    """A node of several parents: the edges' cotangents, gathered per node."""
    forest = grids(2, HIDDEN, 3, 3, dtype="float64", seed=3)
    assert_same_gradients(*gradients_on_both(dag_rnn, forest,
                                             dag_rnn_params(HIDDEN, dtype="float64"), 5))


def test_a_pullback_on_the_gpu_is_one_cooperative_launch(monkeypatch):
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    out, pullback = tree_lstm.vjp(FOREST, p, backend="cuda")
    launches = []
    launch = device.CooperativeLaunch.__call__

    def counted(self, blocks, arguments):
        launches.append(blocks)
        return launch(self, blocks, arguments)

    monkeypatch.setattr(device.CooperativeLaunch, "__call__", counted)
    pullback(roots=tuple(np.ones(state.shape) for state in out.roots))
    assert len(launches) == 1


def test_a_gpu_pullback_copies_back_each_weights_gradient_summed_not_its_rows(monkeypatch):
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 2)
    out, pullback = tree_lstm.vjp(FOREST, p, backend="cuda")
    copied = []
    reduce = Pullback.reduce

    def seen(self, arrays, sink):
        copied.append(set(arrays))
        return reduce(self, arrays, sink)

    monkeypatch.setattr(Pullback, "reduce", seen)
    pullback(roots=tuple(np.ones(state.shape) for state in out.roots))
    sums = gradient_sums(pullback.compiled.kernel)
    assert {total.parameter for total in sums} >= {"U_iou", "U_f", "W_iou", "b_iou"}
    summed_rows = {rows.name for total in sums for rows in total.summed}
    assert {total.total for total in sums} <= copied[0]
    assert not summed_rows & copied[0]


def test_a_gpu_pullback_reads_parameters_kept_on_the_device_without_a_copy(monkeypatch):
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 5)
    on_device = p.to_device()
    out, pullback = tree_lstm.vjp(FOREST, on_device, backend="cuda")
    uploads = []
    to_device = device.to_device

    def counted(what, value, dtype):
        if isinstance(value, np.ndarray):
            uploads.append(what)
        return to_device(what, value, dtype)

    monkeypatch.setattr(device, "to_device", counted)
    roots = cotangents([state.shape for state in out.roots], 4)
    gpu = pullback(roots=roots)
    assert not [what for what in uploads if what.startswith("parameter")]
    assert_same_gradients(gpu, tree_lstm.vjp(FOREST, p)[1](roots=roots))


@settings(max_examples=3, deadline=None)
@given(seed=seeds)
def test_per_tree_gradients_on_the_gpu_are_the_cpus(seed):
    """Per tree, the host reduces the rows as the CPU's do, not the kernel's sums."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", seed % 5)
    assert_same_gradients(*gradients_on_both(tree_lstm, FOREST, p, seed, per_tree=True))


def test_a_forest_of_leaves_alone_sums_no_nodes_weight_gradient_to_zero():
    forest = rj.Forest.from_nested([3, 1, 4])
    gpu, cpu = gradients_on_both(tree_lstm, forest, tree_lstm_params(HIDDEN, VOCAB, "float64",
                                                                      3), 7)
    assert_same_gradients(gpu, cpu)
    assert not np.asarray(gpu.params.U_iou).any()


def test_an_empty_forests_gpu_pullback_gives_the_cpus_zero_gradients():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    gpu, cpu = gradients_on_both(tree_lstm, rj.Forest.from_nested([]), p, 1)
    assert_same_gradients(gpu, cpu)


@pytest.mark.parametrize("wrt", ["x", "E"], ids=["a field", "gathered rows"])
def test_a_jacobian_on_the_gpu_is_the_cpus(wrt):
    forest = rj.Forest.from_nested([((0, 1), 2), (3, (4, 5))])
    forest.fields["x"] = np.random.default_rng(2).normal(size=(forest.num_nodes, 2))
    p = fielded_params(3)
    np.testing.assert_allclose(fielded.jacobian(forest, p, wrt=wrt, backend="cuda"),
                               fielded.jacobian(forest, p, wrt=wrt), rtol=1e-10, atol=1e-12)


def test_the_gpus_backward_kernel_prints_with_grad_true():
    tree_lstm.vjp(FOREST, tree_lstm_params(HIDDEN, VOCAB, "float64", 1), backend="cuda")
    source = tree_lstm.kernel_source("cuda", grad=True)
    assert source.startswith('"""Generated by recjit: the backward pass of cell function '
                             "`tree_lstm` (float64, CUDA, fused: one cooperative launch")
    assert "grid.sync()  # barrier: the next batch reads the cotangents" in source


@pytest.mark.parametrize("remat", [False, True], ids=["kept", "recomputed"])
def test_the_gpus_backward_reads_the_products_its_forward_kept_or_recomputes_them(remat):
    schedule = rj.Schedule(remat=remat)
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    _, pullback = tree_lstm.vjp(FOREST, p, backend="cuda", schedule=schedule)
    assert bool(pullback.kept) is not remat
    assert_same_gradients(*gradients_on_both(tree_lstm, FOREST, p, 3, schedule))


def test_on_a_device_without_cooperative_launches_the_backward_runs_unfused(monkeypatch):
    monkeypatch.setattr(device, "no_cooperative_launch",
                        lambda: "this GPU does not support cooperative launches")
    monkeypatch.setattr(tree_lstm, "_compiled", {})
    monkeypatch.setattr(tree_lstm, "_adjoints", {})
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 4)
    with pytest.warns(rj.FallbackWarning, match="tree_lstm: the fused schedule needs"):
        gpu, cpu = gradients_on_both(tree_lstm, FOREST, p, 6)
    assert_same_gradients(gpu, cpu)
    assert "unfused: one launch per parallel step" in tree_lstm.kernel_source("cuda", grad=True)
