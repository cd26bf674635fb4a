"""`vjp(backend="cuda")`: the backward kernel generated, planned and launched as the forward's
(`codegen_cuda.backward`) gives the CPU's gradients, for every model of the zoo, fused and
unfused; in numba's simulator without a GPU (grids of several blocks: test_cuda_grid.py)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import cuda

import recjit as rj
from dag_rnn import dag_rnn, grids, make_params as dag_rnn_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from recjit.autodiff import Pullback
from recjit.codegen_cuda import buffers, device
from recjit.lowering.backward import gradient_sums
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm

from conftest import (cotangents, max_pooled, min_pooled, scaled_rnn, seeds, tree_convolution,
                      vector_rnn_params)
from conftest import assert_same_gradients
from test_gradients import HIDDEN, VOCAB, ZOO, fielded, fielded_params

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


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@pytest.mark.parametrize("model", [max_pooled, min_pooled, tree_convolution],
                         ids=["a running maximum", "a running minimum, the child first",
                              "a child's place"])
def test_a_cell_over_any_number_of_children_gets_the_cpus_gradients_on_the_gpu(model,
                                                                               schedule):
    """A maximum's cotangent to the one child the chain of maximums returns, found by a
    minimum over the children inside the loop over them; a child's place read per edge."""
    forest = rj.Forest.from_nested([((1, 2, 3), (4,), 5), 0, (1, (2, 3, 4, 5), 0)])
    assert_same_gradients(*gradients_on_both(model, forest,
                                             vector_rnn_params(HIDDEN, VOCAB, seed=4), 7,
                                             schedule))


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

    def seen(self, arrays, sink, groups=None):
        copied.append(set(arrays))
        return reduce(self, arrays, sink, groups)

    monkeypatch.setattr(Pullback, "reduce", seen)
    pullback(roots=tuple(np.ones(state.shape) for state in out.roots))
    sums = gradient_sums(pullback.compiled.kernel)
    assert {total.parameter for total in sums} >= {"U_iou", "U_f", "W_iou", "b_iou"}
    summed_rows = {rows.name for total in sums for rows in total.summed}
    assert {total.total for total in sums} <= copied[0]
    assert not summed_rows & copied[0]


def test_a_gpu_pullback_sums_a_matrix_weights_gradient_over_every_nodes_rows():
    """MV-RNN's W_M gets a `GradientSum` of its own shape: a row of a node's matrices is a
    column of the pair's arrays, so the sum runs over every node's rows."""
    p = mv_rnn_params(HIDDEN, VOCAB, "float64", 2)
    out, pullback = mv_rnn.vjp(FOREST, p, backend="cuda")
    sums = {total.parameter: total.shape for total in gradient_sums(pullback.compiled.kernel)}
    assert sums["W_M"] == p.W_M.shape
    roots = tuple(np.ones(state.shape) for state in out.roots)
    _, on_cpu = mv_rnn.vjp(FOREST, p)
    np.testing.assert_allclose(pullback(roots=roots).params.W_M,
                               on_cpu(roots=roots).params.W_M, rtol=1e-12, atol=1e-12)


def device_calls(monkeypatch):
    """The names of the device allocations, host arrays copied up one by one, and copies
    back that the calls after it make."""
    calls = []
    allocate, upload = device.device_array, device.to_device
    array_type = type(allocate(1, np.float64))
    copy_back = array_type.copy_to_host

    def allocated(shape, dtype):
        calls.append("allocation")
        return allocate(shape, dtype)

    def uploaded(what, value, dtype):
        if isinstance(value, np.ndarray):
            calls.append(f"upload of {what}")
        return upload(what, value, dtype)

    def copied(self, *args, **kwargs):
        calls.append("copy back")
        return copy_back(self, *args, **kwargs)

    monkeypatch.setattr(device, "device_array", allocated)
    monkeypatch.setattr(device, "to_device", uploaded)
    monkeypatch.setattr(array_type, "copy_to_host", copied)
    return calls


def test_a_gpu_pullback_allocates_once_and_copies_back_once(monkeypatch):
    """Its states and cotangents go up with the forest's arrays, in the upload kept from the
    first pullback; its outputs are views of one allocation, copied back in one copy (the
    parameters are on the device), and the check of those parameters copies back its flags
    in another."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 2).to_device()
    out, pullback = tree_lstm.vjp(FOREST, p, backend="cuda")
    roots = cotangents([state.shape for state in out.roots], 3)
    first = pullback(roots=roots)
    calls = device_calls(monkeypatch)
    again = pullback(roots=roots)
    assert sorted(calls) == ["allocation", "copy back", "copy back"]
    assert_same_gradients(again, first)


def test_a_gpu_vjps_kept_products_are_views_of_one_allocation(monkeypatch):
    """And its copies of the device parameters, which its pullback compares, of another."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 2).to_device()
    tree_lstm.vjp(FOREST, p, backend="cuda")
    calls = device_calls(monkeypatch)
    _, pullback = tree_lstm.vjp(FOREST, p, backend="cuda")
    assert len(pullback.kept) > 1
    assert calls.count("allocation") == 2


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
    products = set(pullback.kept) - {"state_0", "state_1"}  # the states are kept either way
    assert bool(products) is not remat
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


def with_field_x(forest, values):
    return rj.Forest(forest.child_ptr, forest.child_idx, forest.roots,
                     {**forest.fields, "x": values}, forest.kind)


@pytest.mark.parametrize("per_tree", [False, True], ids=["whole", "per-tree"])
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_gradients_through_a_gpu_field_are_the_host_fields(backend, per_tree):
    """A GPU field stays in the forest's order until a CUDA run reorders it on the device;
    the backward reads it in the linearized order too (the weight it multiplies)."""
    x = np.random.default_rng(0).standard_normal((FOREST.num_nodes, 2))
    on_host, on_gpu = with_field_x(FOREST, x), with_field_x(FOREST, cuda.to_device(x))
    assert list(tree_lstm.linearize(FOREST).old_of_new) != list(range(FOREST.num_nodes))
    p = fielded_params(4)
    out, expected = fielded.vjp(on_host, p)
    roots = cotangents([state.shape for state in out.roots], 5)
    _, got = fielded.vjp(on_gpu, p, backend=backend)
    assert_same_gradients(got(roots=roots, per_tree=per_tree),
                          expected(roots=roots, per_tree=per_tree))


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_jacobian_with_respect_to_a_gpu_field_is_the_host_fields(backend):
    x = np.random.default_rng(1).standard_normal((FOREST.num_nodes, 2))
    p = fielded_params(2)
    np.testing.assert_allclose(
        fielded.jacobian(with_field_x(FOREST, cuda.to_device(x)), p, wrt="x", backend=backend),
        fielded.jacobian(with_field_x(FOREST, x), p, wrt="x"), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("per_tree", [False, True], ids=["whole", "per tree"])
def test_the_gpus_backward_sums_the_leaves_by_word_as_the_cpus(per_tree):
    forest = rj.Forest.from_nested([((1, 2, 1), (2, (1, 0))), (0, 1, 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 3)
    _, gpu = child_sum_tree_lstm.vjp(forest, p, backend="cuda")
    assert gpu.compiled.kernel.group_key == "word"
    assert "the leaves' rows are summed by `word`" in child_sum_tree_lstm.explain(
        forest, p, backend="cuda", grad=True)
    assert_same_gradients(*gradients_on_both(child_sum_tree_lstm, forest, p, 3,
                                             per_tree=per_tree))


@pytest.mark.parametrize("name, rows, schedule", [
    ("U_iou", slice(None), None), ("E", 1, rj.Schedule(remat=True))],
    ids=["a weight", "a gathered row the backward recomputes"])
def test_a_gpu_pullback_after_its_device_parameters_changed_in_place_is_refused_naming_it(
        name, rows, schedule):
    """An optimizer's step on the device between vjp and a pullback would otherwise give a
    gradient mixing the new parameters with the forward's states."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 6).to_device()
    out, pullback = tree_lstm.vjp(forest, p, backend="cuda", schedule=schedule)
    roots = cotangents([state.shape for state in out.roots], 5)
    pullback(roots=roots)
    updated = getattr(p, name).copy_to_host()
    updated[rows] += 1
    getattr(p, name).copy_to_device(updated)
    with pytest.raises(rj.InputError, match=f"parameter '{name}' changed in place after vjp"):
        pullback(roots=roots)


def test_a_gpu_pullback_after_a_gathered_device_row_changed_gives_the_forwards_gradients():
    """The forward kept the rows it gathered on the device; the backward reads those."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 7).to_device()
    out, pullback = tree_lstm.vjp(forest, p, backend="cuda")
    roots = cotangents([state.shape for state in out.roots], 6)
    before = pullback(roots=roots)
    table = p.E.copy_to_host()
    table[:3] += 1
    p.E.copy_to_device(table)
    assert_same_gradients(pullback(roots=roots), before, rtol=0, atol=0)


def test_a_gpu_pullback_takes_a_change_to_device_rows_its_forest_does_not_gather():
    """Where the backward recomputes the gathers, only the gathered rows are compared."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 7).to_device()
    out, pullback = tree_lstm.vjp(forest, p, backend="cuda", schedule=rj.Schedule(remat=True))
    roots = cotangents([state.shape for state in out.roots], 6)
    before = pullback(roots=roots)
    table = p.E.copy_to_host()
    table[VOCAB - 1] += 1
    p.E.copy_to_device(table)
    assert_same_gradients(pullback(roots=roots), before)


def test_a_nan_device_parameter_is_no_change_to_a_gpu_pullback():
    """A NaN parameter the forward read is the same NaN at the pullback: not a change."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 8)
    p.b_iou[0] = np.nan
    out, pullback = tree_lstm.vjp(forest, p.to_device(), backend="cuda")
    gradients = pullback(roots=cotangents([state.shape for state in out.roots], 7))
    assert np.shape(gradients.params.b_iou) == p.b_iou.shape


def test_a_gpu_pullback_after_a_scalar_device_parameter_changed_is_refused_naming_it():
    """A Python number on the device (`Params.to_device()`) is an array of no dimensions."""
    rng = np.random.default_rng(9)
    p = rj.Params(E=rng.normal(size=(VOCAB, HIDDEN)), W=rng.normal(size=(HIDDEN, HIDDEN)) / 2,
                  alpha=0.7).to_device()
    out, pullback = scaled_rnn.vjp(rj.Forest.from_nested([((0, 1), 2)]), p, backend="cuda")
    alpha = p.alpha.copy_to_host()
    p.alpha.copy_to_device(alpha + 1)
    with pytest.raises(rj.InputError, match="parameter 'alpha' changed in place after vjp"):
        pullback(roots=np.ones_like(out.roots[0]))


def test_a_gpu_pullback_leaves_the_dense_gradients_on_the_device_when_asked():
    """The kernel's sums are not copied back; a gathered table's rows and a field's gradient
    are the host's, as without the option."""
    forest = with_field_x(FOREST, np.random.default_rng(3).standard_normal((FOREST.num_nodes,
                                                                             2)))
    out, pullback = fielded.vjp(forest, fielded_params(3).to_device(), backend="cuda")
    roots = cotangents([state.shape for state in out.roots], 8)[0]
    on_host, on_device = pullback(roots=roots), pullback(roots=roots, device_output=True)
    for name in ("W", "U"):
        gradient = getattr(on_device.params, name)
        assert not isinstance(gradient, np.ndarray)
        np.testing.assert_allclose(gradient.copy_to_host(), getattr(on_host.params, name),
                                   rtol=1e-12, atol=1e-12)
    assert isinstance(on_device.params.E, rj.RowGrad)
    np.testing.assert_array_equal(on_device.params.E.values, on_host.params.E.values)
    np.testing.assert_array_equal(on_device.fields["x"], on_host.fields["x"])


DEVICE_GRADIENT_MODELS = {
    "tree_lstm": (tree_lstm, tree_lstm_params, FOREST),
    "child_sum_tree_lstm": (child_sum_tree_lstm, tree_lstm_params,
                            rj.Forest.from_nested([((1, 2, 3), 4), (0, (1, 5))])),
    "dag_rnn": (dag_rnn, lambda hidden, vocab, dtype, seed: dag_rnn_params(
        hidden, dtype=dtype, seed=seed), grids(2, HIDDEN, 2, 3, dtype="float64", seed=1)),
    "mv_rnn": (mv_rnn, mv_rnn_params, FOREST)}


@pytest.mark.parametrize("name", sorted(DEVICE_GRADIENT_MODELS))
def test_device_gradients_are_the_hosts(name):
    """Parameters with several sums (a binary TreeLSTM's U_f, one a child; MV-RNN's W_M,
    over its matrices' rows) and parts summed on the host (TreeLSTM's b_f) come together
    on the device."""
    model, make, forest = DEVICE_GRADIENT_MODELS[name]
    out, pullback = model.vjp(forest, make(HIDDEN, VOCAB, "float64", 4), backend="cuda")
    roots = cotangents([state.shape for state in out.roots], 9)
    roots = roots[0] if len(roots) == 1 else roots
    on_host, on_device = pullback(roots=roots), pullback(roots=roots, device_output=True)
    for parameter, expected in vars(on_host.params).items():
        got = getattr(on_device.params, parameter)
        if isinstance(expected, rj.RowGrad):
            np.testing.assert_array_equal(got.values, expected.values)
        else:
            np.testing.assert_allclose(got.copy_to_host(), expected, rtol=1e-12, atol=1e-12)


def test_only_a_gpu_pullback_says_it_gives_device_gradients():
    """What `rj.torch` asks before it asks for gradients left on the device."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 2)
    assert tree_lstm.vjp(FOREST, p, backend="cuda")[1].gives_device_gradients
    assert not tree_lstm.vjp(FOREST, p)[1].gives_device_gradients


def test_device_output_is_refused_where_the_gradients_are_not_the_gpus():
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 6)
    out, on_cpu = tree_lstm.vjp(forest, p)
    roots = (np.ones_like(out.roots[0]), None)
    with pytest.raises(rj.RecJitError, match="device_output=True asks for gradients on the GPU"):
        on_cpu(roots=roots, device_output=True)
    _, on_gpu = tree_lstm.vjp(forest, p, backend="cuda")
    with pytest.raises(rj.RecJitError, match=r"\(per_tree=False\)"):
        on_gpu(roots=roots, per_tree=True, device_output=True)


def test_a_gpu_backward_reads_the_states_its_forward_left_on_the_device(monkeypatch):
    """The states come down for the caller's loss, but do not go up again for the backward:
    the forward copied them on the device, beside its kept products."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 3).to_device()
    out, pullback = tree_lstm.vjp(FOREST, p, backend="cuda")
    assert {"state_0", "state_1"} <= set(pullback.kept)
    uploads = []
    forest = buffers.DeviceBuffers.forest
    monkeypatch.setattr(buffers.DeviceBuffers, "forest",
                        lambda self, arrays: uploads.append(set(arrays)) or forest(self, arrays))
    roots = cotangents([state.shape for state in out.roots], 2)
    got = pullback(roots=roots)
    assert uploads and not any("state_0" in names for names in uploads)
    assert_same_gradients(got, tree_lstm.vjp(FOREST, tree_lstm_params(
        HIDDEN, VOCAB, "float64", 3))[1](roots=roots))


@pytest.mark.parametrize("unroll", [2, 3])
def test_an_unrolled_gpu_forwards_gradients_are_the_cpus(unroll):
    """Its batches mix heights, so the backward takes the states in a numbering of its own:
    not the copy the forward left on the device, which is in the forward's."""
    schedule = rj.Schedule(unroll=unroll)
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 5)
    gpu, cpu = gradients_on_both(tree_lstm, FOREST, p, 7, schedule)
    assert_same_gradients(gpu, cpu)
