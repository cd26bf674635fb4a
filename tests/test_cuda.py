"""The CUDA backend: every model of the zoo, run through its generated kernel (in numba's
simulator without a GPU), equals the naive recursion within 1e-5 relative (float64); the
fused schedule is one launch per run; parameters and results can stay on the device."""
import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import recjit as rj
from recjit.codegen_cuda import device
from recjit.codegen_cuda.buffers import DeviceBuffers
from recjit.schedule import MAX_THREADS
from dag_rnn import dag_rnn, grids, make_params as dag_rnn_params
from gru import gru, make_params as gru_params
from lstm import lstm, make_params as lstm_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from simple_tree_gru import simple_tree_gru
from tree_attention import make_params as tree_attention_params, tree_attention
from tree_fc import make_params as tree_fc_params, tree_fc
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from conftest import assert_same_result, attentive_child_sum, attentive_params, \
    binary_forests, caterpillar, child_mean, gated_child_list, max_pooled, min_pooled, \
    nary_forests, powered_rnn, random_dags, row_major_params, row_major_rnn, scaled_rnn, \
    scaled_rnn_params, seeds, time_aware_rnn, transposed_mv_params, transposed_mv_rnn, \
    tree_convolution, vector_rnn_params, with_time_steps, word_sequences
from numba import cuda
from numba.core import config, types as numba_types

VOCAB = 12
HIDDEN = 3
FUSED, UNFUSED = rj.Schedule(), rj.Schedule(fusion=False)
# The simulator runs every GPU thread as a Python thread: few, small examples.
small = settings(max_examples=4)


def check(model, forest, p, schedule=FUSED):
    assert_same_result(model.run(forest, p, backend="cuda", schedule=schedule),
                       model.reference(forest, p))


TREE_MODELS = {
    "tree_fc": (tree_fc, tree_fc_params), "tree_rnn": (tree_rnn, tree_rnn_params),
    "tree_lstm": (tree_lstm, tree_lstm_params), "mv_rnn": (mv_rnn, mv_rnn_params)}
CHILD_SUM_MODELS = {
    "tree_gru": (tree_gru, tree_gru_params), "simple_tree_gru": (simple_tree_gru,
                                                                 tree_gru_params),
    "child_sum_tree_lstm": (child_sum_tree_lstm, tree_lstm_params),
    "tree_attention": (tree_attention, tree_attention_params)}
SEQUENCE_MODELS = {"lstm": (lstm, lstm_params), "gru": (gru, gru_params)}


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", sorted(TREE_MODELS))
@small
@given(forest=binary_forests(VOCAB, max_trees=3, max_leaves=6), seed=seeds)
def test_binary_tree_models_equal_reference(name, schedule, forest, seed):
    model, make_params = TREE_MODELS[name]
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule)


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", sorted(CHILD_SUM_MODELS))
@small
@given(forest=nary_forests(VOCAB, max_trees=3, max_leaves=6, max_children=4), seed=seeds)
def test_child_sum_models_equal_reference(name, schedule, forest, seed):
    model, make_params = CHILD_SUM_MODELS[name]
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule)


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", sorted(SEQUENCE_MODELS))
@small
@given(forest=word_sequences(VOCAB, max_length=8, max_sequences=3), seed=seeds)
def test_sequence_models_equal_reference(name, schedule, forest, seed):
    model, make_params = SEQUENCE_MODELS[name]
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule)


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@small
@given(rows=st.integers(1, 4), cols=st.integers(1, 4), seed=seeds)
def test_dag_rnn_equals_reference_on_grids(schedule, rows, cols, seed):
    forest = grids(2, HIDDEN, rows, cols, dtype="float64", seed=seed)
    check(dag_rnn, forest, dag_rnn_params(HIDDEN, dtype="float64", seed=seed), schedule)


@small
@given(forest=random_dags(features=HIDDEN, max_nodes=10), seed=seeds)
def test_dag_rnn_equals_reference_on_random_dags(forest, seed):
    check(dag_rnn, forest, dag_rnn_params(HIDDEN, dtype="float64", seed=seed))


UNROLLED_TREE_MODELS = {**TREE_MODELS, **CHILD_SUM_MODELS}


@settings(max_examples=8)
@given(name=st.sampled_from(sorted(UNROLLED_TREE_MODELS)), unroll=st.integers(2, 3),
       fusion=st.booleans(), specialize=st.booleans(), data=st.data(), seed=seeds)
def test_unrolled_tree_models_equal_reference(name, unroll, fusion, specialize, data, seed):
    model, make_params = UNROLLED_TREE_MODELS[name]
    forest = data.draw(binary_forests(VOCAB, max_trees=3, max_leaves=6) if name in TREE_MODELS
                       else nary_forests(VOCAB, max_trees=3, max_leaves=6, max_children=4))
    schedule = rj.Schedule(unroll=unroll, fusion=fusion, specialize=specialize)
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule)


@small
@given(name=st.sampled_from(sorted(SEQUENCE_MODELS)), fusion=st.booleans(),
       forest=word_sequences(VOCAB, max_length=8, max_sequences=3), seed=seeds)
def test_unrolled_sequence_models_equal_reference(name, fusion, forest, seed):
    model, make_params = SEQUENCE_MODELS[name]
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed),
          rj.Schedule(unroll=3, fusion=fusion))


def launch_grids(monkeypatch, run):
    """The grid of every kernel launch `run()` makes: each launch configures a dispatcher,
    or, on a GPU, goes to the driver with parameters recjit laid out (`CooperativeLaunch`)."""
    from recjit.codegen_cuda import device
    from recjit.codegen_cuda.runtime import matmul_kernel
    dispatcher_type = type(matmul_kernel)
    configure, driver_launch = dispatcher_type.__getitem__, device.driver_launch
    grids = []

    def recording(self, configuration):
        grids.append(configuration[0])
        return configure(self, configuration)

    def recording_driver_launch(function, blocks, *arguments):
        grids.append(blocks)
        return driver_launch(function, blocks, *arguments)

    monkeypatch.setattr(dispatcher_type, "__getitem__", recording)
    monkeypatch.setattr(device, "driver_launch", recording_driver_launch)
    run()
    monkeypatch.undo()
    return grids


def test_the_fused_schedule_is_one_launch_per_run(monkeypatch):
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    tree_lstm.run(forest, p, backend="cuda")
    assert len(launch_grids(monkeypatch, lambda: tree_lstm.run(forest, p, backend="cuda"))) == 1


def fall_back_checks(monkeypatch, hidden, seed):
    """A TreeLSTM of a hidden size no other test compiles (so its kernel is compiled here),
    run under the fused schedule: it warns that it fell back, says so in `explain()`,
    launches per step and equals the reference."""
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = tree_lstm_params(hidden, VOCAB, "float64", seed)
    with pytest.warns(rj.FallbackWarning, match="running the unfused schedule"):
        check(tree_lstm, forest, p)
    text = tree_lstm.explain(forest, p, backend="cuda", file=io.StringIO())
    assert "launch: unfused (the fused schedule falls back to it:" in text
    assert len(launch_grids(monkeypatch, lambda: check(tree_lstm, forest, p))) > 1
    return text


def test_a_device_without_cooperative_launches_runs_the_fused_schedule_unfused(monkeypatch):
    monkeypatch.setattr(device, "no_cooperative_launch",
                        lambda: "this GPU does not support cooperative launches")
    text = fall_back_checks(monkeypatch, 5, 12)
    assert "this GPU does not support cooperative launches" in text


def test_a_fused_kernel_of_which_no_block_fits_runs_unfused(monkeypatch):
    monkeypatch.setattr(device.CooperativeLaunch, "max_blocks", lambda self: 0)
    text = fall_back_checks(monkeypatch, 6, 13)
    assert "fits on a multiprocessor" in text


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="the simulator launches through numba")
def test_a_fused_launch_on_a_gpu_goes_to_the_driver_with_parameters_laid_out_once(monkeypatch):
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float32").to_device()
    tree_lstm.run(forest, p, backend="cuda")
    driver_launch, buffers = device.driver_launch, []

    def recording(function, blocks, threads, stream, parameters):
        buffers.append(parameters)
        return driver_launch(function, blocks, threads, stream, parameters)

    monkeypatch.setattr(device, "driver_launch", recording)
    for _ in range(2):
        tree_lstm.run(forest, p, backend="cuda")
    assert len(buffers) == 2 and buffers[0] is buffers[1]


def test_copies_go_to_the_driver_at_the_buffers_addresses_looked_up_once(monkeypatch):
    calls = []

    class Driver:
        def cuMemcpyHtoDAsync_v2(self, *arguments):  # noqa: N802 (the driver's name)
            calls.append(("to device", *arguments))
            return 0

        def cuMemcpyDtoH_v2(self, *arguments):  # noqa: N802
            calls.append(("to host", *arguments))
            return 0

    class OnDevice:
        device_ctypes_pointer = type("Pointer", (), {"value": 1 << 40})

    monkeypatch.setattr(device, "simulated", lambda: False)
    monkeypatch.setattr(device, "_driver", Driver)
    monkeypatch.setattr(device, "launch_stream", lambda: 7)
    on_host = np.zeros(64, np.uint8)
    copies = device.Copies(on_host, OnDevice())
    host = on_host.ctypes.data
    copies.queue_to_device()
    copies.to_host(16, 24)
    copies.to_host(8, 0)  # nothing to copy: no call
    assert calls == [("to device", 1 << 40, host, 64, 7),
                     ("to host", host + 16, (1 << 40) + 16, 24)]


class FakeDeviceArray:
    """What a launch's layout reads of a numba device array, over a NumPy array."""

    def __init__(self, values, address):
        self.values = values
        self.dtype, self.ndim, self.shape = values.dtype, values.ndim, values.shape
        self.size, self.strides = values.size, values.strides
        self.device_ctypes_pointer = type("Pointer", (), {"value": address})

    def is_c_contiguous(self):
        return self.values.flags.c_contiguous


def laid_out(types, arguments):
    launch = object.__new__(device.CooperativeLaunch)
    launch.types = tuple(types)
    return launch._lay_out(arguments)


MATRIX_TYPE, VECTOR_TYPE = (numba_types.Array(numba_types.float32, 2, "C"),
                            numba_types.Array(numba_types.int32, 1, "C"))


def test_a_launchs_parameters_are_numbas_flattening_of_its_arguments():
    """numba-cuda flattens a device array into meminfo, parent, size, itemsize, pointer,
    shape and byte strides, a slot each, and a scalar into a slot."""
    parameters = laid_out(
        (numba_types.int64, MATRIX_TYPE, VECTOR_TYPE),
        (5, FakeDeviceArray(np.zeros((3, 4), np.float32), 1 << 40),
         FakeDeviceArray(np.zeros(6, np.int32), 2 << 40)))
    assert list(parameters.values) == [0, 0, 0, 12, 4, 1 << 40, 3, 4, 16, 4,
                                       0, 0, 6, 4, 2 << 40, 6, 4]
    assert parameters.scalar_slots == [0]


@pytest.mark.parametrize("values", [
    np.zeros((4, 3), np.float32).T,  # not C-contiguous
    np.zeros((3, 4), np.float64),  # another dtype
    np.zeros(3, np.float32),  # another number of dimensions
    np.broadcast_to(np.zeros(4, np.float32), (1, 4)),  # a zero stride: numba types it 'A'
], ids=["transposed", "float64", "vector", "broadcast"])
def test_an_array_numba_types_otherwise_goes_through_numbas_launch(values):
    assert laid_out((MATRIX_TYPE,), (FakeDeviceArray(values, 1 << 40),)) is None


@pytest.mark.parametrize("refactor, launches", [
    # leaves: pack, product, elementwise; each of the 3 batches: pack, 2 products, elementwise;
    # then the roots' gather
    (False, 3 + 3 * 4 + 1),
    # the same, each pass followed by the 2 refactored products of its states, but for the
    # last batch (the roots: no parent reads them); no batch packs
    (True, (3 + 2) + 2 * (1 + 2) + 1 + 1)], ids=["plain", "refactored"])
def test_the_unfused_schedule_launches_per_step_and_product(monkeypatch, refactor, launches):
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    schedule = UNFUSED.but(refactor=refactor)
    tree_lstm.run(forest, p, backend="cuda", schedule=schedule)
    grids = launch_grids(monkeypatch, lambda: tree_lstm.run(
        forest, p, backend="cuda", schedule=schedule))
    assert len(grids) == launches


def test_unfused_launches_of_several_blocks_equal_reference(monkeypatch):
    """Wide enough that steps and products spread over several blocks of 64 threads."""
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7), ((8, 9), 10)])
    p = tree_lstm_params(16, VOCAB, "float64", 11)
    grids = launch_grids(monkeypatch, lambda: check(tree_lstm, forest, p,
                                                    UNFUSED.but(threads=64)))
    assert max(grids) > 1


def test_unrolled_items_on_several_blocks_each_use_scratch_of_their_own(monkeypatch):
    """Unfused, the items of a batch spread over blocks even simulated; a block sharing
    another's scratch would mix their nodes."""
    forest = rj.Forest.from_nested([((1, 2), (3, 4)), ((5, 6), 7), ((8, 9), (10, 11)), (1, 3)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 5)
    schedule = rj.Schedule(unroll=2, fusion=False)
    grids = launch_grids(monkeypatch, lambda: check(tree_lstm, forest, p, schedule))
    assert max(grids) > 1


def test_device_parameters_are_reused_across_runs():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 3)
    on_device = p.to_device()
    for nested in ([(1, (2, 3))], [((4, 5), (6, 7)), (8, 9)]):
        forest = rj.Forest.from_nested(nested)
        assert_same_result(tree_lstm.run(forest, on_device, backend="cuda"),
                           tree_lstm.reference(forest, p))


def test_a_device_parameter_replaced_between_runs_is_the_one_the_next_run_reads():
    """Device parameters are kept by identity from run to run: another array in their place
    is read, and host parameters are copied again at every run, changed or not."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 4)
    other = tree_lstm_params(HIDDEN, VOCAB, "float64", 5)
    forest = rj.Forest.from_nested([(1, (2, 3)), 4])
    on_device = p.to_device()
    tree_lstm.run(forest, on_device, backend="cuda")
    on_device.W_iou = cuda.to_device(other.W_iou)
    p.W_iou = other.W_iou
    assert_same_result(tree_lstm.run(forest, on_device, backend="cuda"),
                       tree_lstm.reference(forest, p))
    p.W_iou[:] = -p.W_iou
    assert_same_result(tree_lstm.run(forest, p, backend="cuda"), tree_lstm.reference(forest, p))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_products_of_more_columns_than_a_warp_has_lanes_equal_reference(schedule):
    """On a GPU a warp computes each output of a product of 32 columns or more, its lanes
    summed by shuffles; narrower ones, as in the other tests here, by one lane."""
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    check(tree_lstm, forest, tree_lstm_params(45, VOCAB, "float64", 12), schedule)


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_a_schedules_threads_a_block_run_every_launch_and_equal_reference(fusion):
    """64 threads a block in the simulator (its default is 32), the most on a GPU."""
    threads = 64 if config.ENABLE_CUDASIM else MAX_THREADS
    schedule = rj.Schedule(fusion=fusion, threads=threads)
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = tree_lstm_params(45, VOCAB, "float64", 13)
    check(tree_lstm, forest, p, schedule)
    explained = tree_lstm.explain(forest, p, backend="cuda", schedule=schedule, file=io.StringIO())
    assert fusion is False or f"{threads} threads" in explained


def test_forests_growing_and_shrinking_in_turn_each_equal_reference():
    """Runs keep their device buffers, sized to a power of two of the nodes: each forest here
    falls in another bucket than the one before, or back in an earlier one."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 7)
    for depth in (1, 20, 2, 9, 40, 1):
        forest = caterpillar(depth, VOCAB)
        assert_same_result(tree_lstm.run(forest, p, backend="cuda"),
                           tree_lstm.reference(forest, p))


def test_a_result_keeps_its_states_when_a_later_run_reuses_the_buffers():
    """Results come back in arrays of their own, not views of the kept device buffers."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 9)
    first, second = caterpillar(12, VOCAB), caterpillar(13, VOCAB)  # 25, 27 nodes: 32 rows
    kept = tree_lstm.run(first, p, backend="cuda")
    tree_lstm.run(second, p, backend="cuda")
    assert_same_result(kept, tree_lstm.reference(first, p))


def test_buffer_rows_are_the_next_power_of_two_and_at_least_the_smallest_bucket():
    from recjit.codegen_cuda.buffers import SMALLEST_BUCKET, bucket
    assert [bucket(rows) for rows in (0, 1, SMALLEST_BUCKET, SMALLEST_BUCKET + 1, 1000)] == \
        [SMALLEST_BUCKET, SMALLEST_BUCKET, SMALLEST_BUCKET, 2 * SMALLEST_BUCKET, 1024]


def test_buffers_keep_the_most_recently_used_layouts_only():
    from recjit.codegen_cuda.buffers import KEPT_LAYOUTS
    buffers = DeviceBuffers()

    def states(nodes=1, columns=1):
        states = buffers.states(nodes, 1, (("state_0", columns),), np.float64)
        assert not states.lent()
        return states

    first = states()
    assert states(nodes=2) is first  # the same bucket of rows
    for columns in range(2, KEPT_LAYOUTS + 1):
        states(columns=columns)
    assert states() is first
    states(columns=KEPT_LAYOUTS + 1)
    assert states() is first  # used last, so another layout went
    for columns in range(KEPT_LAYOUTS + 2, 2 * KEPT_LAYOUTS + 2):
        states(columns=columns)
    assert states() is not first


def test_forest_arrays_of_several_dtypes_and_odd_sizes_go_up_in_one_buffer_intact():
    arrays = {"weights": np.arange(3, dtype=np.float32) / 7,  # 12 bytes, then padding
              "children": np.arange(10, dtype=np.int64).reshape(5, 2) - 4,
              "mask": np.array([1, 0, 1], dtype=np.int8),
              "inputs": np.linspace(-1, 1, 9).reshape(3, 3)}
    views = DeviceBuffers().forest(arrays)
    for name, values in arrays.items():
        on_host = views[name].copy_to_host()
        assert on_host.dtype == values.dtype
        np.testing.assert_array_equal(on_host[:len(values)], values)


def test_a_generated_host_function_sizes_the_scratch_to_bucketed_rows():
    from recjit.codegen_cuda.buffers import bucket
    from recjit.codegen_cuda.emit import scratch_arrays
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 3)
    refactored = rj.Schedule(refactor=True)  # its projections have a row per node
    kernel = tree_lstm.compile(caterpillar(4, VOCAB), p, "cuda", refactored).backend_kernel
    assert "def scratch_shapes(" in kernel.source
    sizes = dict.fromkeys(kernel.kernel.scalars, 1)
    sizes.update(num_nodes=40, num_distinct_leaves=3)
    shapes = kernel.scratch_shapes(**sizes, blocks=2)
    assert len(shapes) == len([array for array in scratch_arrays(kernel.kernel)
                               if array.name not in kernel.plan.packs.arrays])
    assert (bucket(40), 3 * HIDDEN) in shapes and (bucket(3), 3 * HIDDEN) in shapes


def test_a_smaller_forest_goes_up_in_an_upload_kept_for_a_larger_one():
    from recjit.codegen_cuda.buffers import SMALLEST_BUCKET
    buffers = DeviceBuffers()

    def forest(nodes):
        return {"child_ptr": np.arange(nodes + 1, dtype=np.int64),
                "field_x": np.linspace(-1, 1, 2 * nodes).reshape(nodes, 2)}

    larger = buffers.forest(forest(3 * SMALLEST_BUCKET))
    smaller = forest(SMALLEST_BUCKET // 2)
    views = buffers.forest(smaller)
    assert views is larger
    for name, values in smaller.items():
        np.testing.assert_array_equal(views[name].copy_to_host()[:len(values)], values)
    assert buffers.forest(forest(5 * SMALLEST_BUCKET)) is not larger  # too many rows


def test_states_of_different_widths_come_back_from_one_buffer_intact():
    """Nodes' rows and roots' rows each in one copy, whatever the widths and padding."""
    states = DeviceBuffers().states(5, 3, (("h", 3), ("C", 7), ("c", 1)), np.float32)
    for arrays, copy_back, rows in ((states.arrays, states.nodes_to_host, 5),
                                    (states.root_arrays, states.roots_to_host, 3)):
        written = {name: np.arange(array.size, dtype=np.float32).reshape(array.shape) + 1000 * i
                   for i, (name, array) in enumerate(arrays.items())}
        for name, values in written.items():
            arrays[name].copy_to_device(values)
        for (name, values), on_host in zip(written.items(), copy_back(rows)):
            np.testing.assert_array_equal(on_host, values[:rows])


def test_a_run_copies_back_the_roots_alone_and_the_nodes_when_first_read(monkeypatch):
    from recjit.codegen_cuda import buffers
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5), 6])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 4)
    copied = []
    for name in ("roots_to_host", "nodes_to_host"):
        method = getattr(buffers._States, name)
        monkeypatch.setattr(buffers._States, name, lambda states, rows, method=method, name=name:
                            copied.append(name) or method(states, rows))
    result = tree_lstm.run(forest, p, backend="cuda")
    assert copied[-1:] == ["roots_to_host"]  # (an older result may have copied its nodes first)
    assert_same_result(result, tree_lstm.reference(forest, p))
    assert copied[-2:] == ["roots_to_host", "nodes_to_host"]


def test_results_kept_across_three_runs_on_the_same_buffers_keep_their_nodes():
    """Two buffers a layout: the third run reuses the first's, whose result copies back its
    nodes before they are overwritten."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 10)
    forests = [caterpillar(depth, VOCAB) for depth in (12, 13, 14)]  # 25-29 nodes: 32 rows
    kept = [tree_lstm.run(forest, p, backend="cuda") for forest in forests]
    assert kept[0].has_nodes and not kept[1].has_nodes and not kept[2].has_nodes
    for result, forest in zip(kept, forests):
        assert_same_result(result, tree_lstm.reference(forest, p))


def test_a_dropped_result_leaves_its_buffer_to_the_next_run_without_a_copy():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 11)
    forest = caterpillar(12, VOCAB)
    tree_lstm.run(forest, p, backend="cuda")
    kept = tree_lstm.run(forest, p, backend="cuda")
    tree_lstm.run(forest, p, backend="cuda")
    tree_lstm.run(forest, p, backend="cuda")
    assert not kept.has_nodes
    assert_same_result(kept, tree_lstm.reference(forest, p))


def test_device_output_is_not_overwritten_by_the_next_run():
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", 8)
    first, second = rj.Forest.from_nested([((1, 2), 3)]), rj.Forest.from_nested([(4, (5, 6))])
    kept = tree_rnn.run(first, p, backend="cuda", device_output=True)
    tree_rnn.run(second, p, backend="cuda", device_output=True)
    on_host = rj.Result(nodes=tuple(a.copy_to_host() for a in kept.nodes),
                        roots=tuple(a.copy_to_host() for a in kept.roots))
    assert_same_result(on_host, tree_rnn.reference(first, p))


def test_an_upload_waits_for_the_last_one_only_after_a_run_that_returned_device_arrays(
        monkeypatch):
    """The forest goes up asynchronously from a pinned buffer that the next run rewrites: a
    run that copied its roots back has waited for its upload, one with device output not."""
    waits = []
    monkeypatch.setattr(device, "synchronize", lambda: waits.append(1))
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5)])
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", 6)
    tree_rnn.run(forest, p, backend="cuda")
    waits.clear()  # (for an earlier test's device output)
    tree_rnn.run(forest, p, backend="cuda")
    tree_rnn.run(forest, p, backend="cuda", device_output=True)
    assert waits == []
    tree_rnn.run(forest, p, backend="cuda")
    assert waits == [1]
    tree_rnn.run(forest, p, backend="cuda")
    assert waits == [1]


def test_device_output_stays_on_the_device_and_equals_host_output():
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5)])
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", 5)
    on_device = tree_rnn.run(forest, p, backend="cuda", device_output=True)
    host = tree_rnn.run(forest, p, backend="cuda")
    for device_array, host_array in zip(on_device.nodes + on_device.roots,
                                        host.nodes + host.roots):
        assert not isinstance(device_array, np.ndarray)
        np.testing.assert_array_equal(device_array.copy_to_host(), host_array)


def test_float32_kernels_equal_reference_within_float32_rounding():
    forest = rj.Forest.from_nested([((1, 2), (3, 4)), 5])
    p = tree_lstm_params(HIDDEN, VOCAB, "float32", 7)
    assert_same_result(tree_lstm.run(forest, p, backend="cuda"), tree_lstm.reference(forest, p),
                       rtol=1e-4, atol=1e-5)


def test_explain_says_which_weights_stay_in_shared_memory():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    text = tree_lstm.explain(forest, tree_lstm_params(HIDDEN, VOCAB, "float64"), backend="cuda",
                             file=io.StringIO())
    assert "launch: fused: one cooperative launch" in text
    assert "kept in shared memory for the whole launch:" in text
    units = -(-HIDDEN // device.multiprocessors())
    assert f"p_U_iou ({3 * units} rows each)" in text
    assert f"p_U_f ({units} rows each)" in text


def test_a_refactored_tree_lstm_batch_has_one_grid_barrier_and_one_block_barrier():
    """The block that owns units e computes rows e, e + H, e + 2H of U_iou and e of U_f, and
    runs the elementwise ops at e: the products' barrier is the block's alone."""
    forest = rj.Forest.from_nested([((1, 2), 3)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    refactored = rj.Schedule(refactor=True)
    text = tree_lstm.explain(forest, p, backend="cuda", schedule=refactored, file=io.StringIO())
    assert "the blocks split the hidden units of p_U_f, p_U_iou, p_W_iou" in text
    ilir = text[text.index("for b in"):text.index("schedule: ")]
    assert ilir.count("── block barrier (each block its own units)") == 1
    batch_loop = (tree_lstm.kernel_source("cuda").split("for b in range")[1]
                  .split("grid.sync()  # barrier: the roots read")[0])
    assert batch_loop.count("grid.sync()") == 1
    assert batch_loop.count("cuda.syncthreads()  # barrier: the next batch reads") == 1
    check(tree_lstm, forest, p, refactored)


def test_an_unrefactored_tree_lstm_batch_has_one_grid_barrier_as_a_refactored_one():
    """Staged, each block packs U_iou's inputs and U_f's, a row per child, into its tile
    itself (block packs): the grid meets once a batch, after the elementwise ops, as
    refactored."""
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 4)
    unrefactored = rj.Schedule(refactor=False, stage_products=True)
    text = tree_lstm.explain(forest, p, backend="cuda", schedule=unrefactored,
                             file=io.StringIO())
    packed = [line for line in text.splitlines()
              if "(each block packs its inputs into its tile itself)" in line]
    assert {line.split(" · ")[1].split("[")[0] for line in packed} == {
        "batch_x_U_f", "batch_x_U_iou", "leaf_x_W_iou"}
    batch_loop = (tree_lstm.kernel_source("cuda").split("for b in range")[1]
                  .split("# no barrier: the grid met after the last writes, so the roots read")[0])
    assert batch_loop.count("grid.sync()") == 1
    check(tree_lstm, forest, p, unrefactored)


def test_tree_grus_product_of_packed_inputs_needs_a_block_barrier_only():
    """Refactored, the packed inputs are rewritten in the next batch, after the grid has met
    at the barrier before the refactored products: no block overwrites them while another
    reads."""
    forest = rj.Forest.from_nested([(1, (2, 3, 4), 5), ((6, 7), 8)])
    p = tree_gru_params(HIDDEN, VOCAB, "float64", 2)
    refactored = rj.Schedule(refactor=True)
    text = tree_gru.explain(forest, p, backend="cuda", schedule=refactored, file=io.StringIO())
    ilir = text[text.index("for b in"):text.index("schedule: ")]
    assert ilir.count("── block barrier (each block its own units)") == 2
    assert ("cuda.syncthreads()  # barrier: the elementwise ops read the products"
            in tree_gru.kernel_source("cuda").split("for b in range")[1])
    check(tree_gru, forest, p, refactored)


def test_without_split_units_every_barrier_is_the_grids_and_still_right():
    forest = rj.Forest.from_nested([((1, 2), 3), 4])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 5)
    schedule = rj.Schedule(split_units=False)
    text = tree_lstm.explain(forest, p, backend="cuda", schedule=schedule, file=io.StringIO())
    assert "split the hidden units" not in text and "block barrier" not in text
    source = tree_lstm.kernel_source("cuda")
    assert "cuda.syncthreads()  # barrier" not in source and "matmul_units(" not in source
    check(tree_lstm, forest, p, schedule)


def test_mv_rnn_reads_its_matrix_products_across_units_and_keeps_grid_barriers():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    p = mv_rnn_params(HIDDEN, VOCAB, "float64")
    text = mv_rnn.explain(forest, p, backend="cuda", file=io.StringIO())
    assert "split the hidden units" not in text and "block barrier" not in text
    assert "cuda.syncthreads()  # barrier" not in mv_rnn.kernel_source("cuda")
    check(mv_rnn, forest, p)


def test_explain_says_how_many_nodes_a_staged_product_stages_at_once():
    """TreeLSTM multiplies rows of HIDDEN floats: 32 nodes' fit next to its weights."""
    forest = rj.Forest.from_nested([((1, 2), 3)])
    text = tree_lstm.explain(forest, tree_lstm_params(HIDDEN, VOCAB, "float64"), backend="cuda",
                             schedule=rj.Schedule(stage_products=True), file=io.StringIO())
    assert "stages their inputs in shared memory, 32 nodes at a time" in text
    assert f"x_tile = cuda.shared.array((32, {HIDDEN}), real)" in tree_lstm.kernel_source("cuda")


def test_explain_prints_the_planned_ilir_that_the_cuda_emitter_prints():
    """Staged, TreeFC's pack loop is each block's own, its barrier a block's, its batch
    ranged."""
    forest = rj.Forest.perfect(7, num_trees=10)
    p = tree_fc_params(256, 1000, "float32", 0)
    text = tree_fc.explain(forest, p, backend="cuda",
                           schedule=rj.Schedule(refactor=False, stage_products=True))
    ilir = text[text.index("== ILIR (cuda) =="):text.index("schedule: ")]
    assert "ranges of the count nodes: each block its share of them and of the 256 units" in ilir
    assert "(each block packs its inputs into its tile itself)" in ilir
    assert "── block barrier (each block its own units): the elementwise ops read" in ilir
    assert "parallel for slot in [0, count) (each block its range of nodes and its units)" in ilir
    assert "── no barrier (the grid met after the last writes): the roots read" in ilir
    assert "batch_x_W[slot" not in ilir  # the grid's pack loop, left out
    source = tree_fc.kernel_source("cuda")
    assert "range_share(256, count, ranges)" in source
    assert "cuda.syncthreads()  # barrier: the elementwise ops read the products" in source


def test_explain_marks_each_loop_over_the_children_that_reduces_them():
    """The lowering says which loop over a node's edges is a reduction, and into which
    value; the CPU's rows of sums and maxima are planned from that mark."""
    forest = rj.Forest.from_nested([((1, 2, 3), (4,), 5)])
    text = max_pooled.explain(forest, vector_rnn_params(4, 10, 0), backend="cuda")
    assert re.search(r"for edge in \[child_ptr\[node\], child_ptr\[\(node \+ 1\)\]\) "
                     r"\(reducing the children into v\d+\):\n +child = child_idx\[edge\]", text)


def test_by_default_products_read_their_inputs_directly_and_are_right():
    forest = rj.Forest.perfect(4, num_trees=2)
    p = tree_fc_params(HIDDEN, 1000, "float64", 7)
    text = tree_fc.explain(forest, p, backend="cuda", file=io.StringIO())
    assert ("products read their inputs directly (Schedule(stage_products=True) stages them "
            "on chip)") in text
    assert "multiply_tile(" not in tree_fc.kernel_source("cuda")
    check(tree_fc, forest, p)


def test_weights_too_large_for_shared_memory_are_read_through_l2_and_still_right():
    forest = rj.Forest.from_nested([((1, 2), (3, 4))])
    # Each block's slices of W and U: 2 × ⌈hidden / blocks⌉ × hidden × 8 bytes > 48 KiB.
    hidden = 80 if device.multiprocessors() == 1 else 1024
    p = tree_rnn_params(hidden, VOCAB, "float64", 2)
    text = tree_rnn.explain(forest, p, backend="cuda", file=io.StringIO())
    assert "do not fit in shared memory: read through L2" in text
    check(tree_rnn, forest, p)


def test_without_model_persistence_weights_are_read_through_l2_and_still_right():
    forest = rj.Forest.from_nested([((1, 2), (3, 4)), 5])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 6)
    schedule = rj.Schedule(persistence=False)
    text = tree_lstm.explain(forest, p, backend="cuda", schedule=schedule, file=io.StringIO())
    assert "model persistence off" in text
    assert "shared_p_" not in tree_lstm.kernel_source("cuda")  # no weight's slice
    check(tree_lstm, forest, p, schedule)


def test_bad_input_is_refused_before_any_kernel_runs():
    forest = rj.Forest.from_nested([(1, VOCAB + 3)])
    with pytest.raises(rj.InputError, match=f"field 'word' = {VOCAB + 3}"):
        tree_rnn.run(forest, tree_rnn_params(HIDDEN, VOCAB, "float64"), backend="cuda")


def test_device_output_needs_the_cuda_backend():
    forest = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.RecJitError, match="device_output"):
        tree_rnn.run(forest, tree_rnn_params(HIDDEN, VOCAB, "float64"), device_output=True)


class Foreign:
    """A GPU array from another library: only `__cuda_array_interface__`."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="the simulator takes NumPy arrays only")
def test_parameters_exposing_the_cuda_array_interface_are_used_in_place():
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", 4)
    foreign = rj.DeviceParams(**{name: Foreign(cuda.to_device(getattr(p, name)))
                                 for name in p.names()})
    forest = rj.Forest.from_nested([((1, 2), 3)])
    assert_same_result(tree_rnn.run(forest, foreign, backend="cuda"),
                       tree_rnn.reference(forest, p))


@rj.recursive_model(arity=2)
def rnn_of_described_parameters(node, p):
    """TreeRNN as a model of its own, which only the test below compiles: nothing cached."""
    if node.is_leaf:
        return p.E[node.word]
    return rj.tanh(p.W @ rnn_of_described_parameters(node.left, p)
                   + p.U @ rnn_of_described_parameters(node.right, p) + p.b)


@pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="the GPU test above uses real arrays")
def test_compiling_reads_a_device_parameters_shape_and_dtype_not_its_values():
    """A parameter that only describes itself (`__cuda_array_interface__`) compiles; the
    simulator then refuses it by name, where the values would go to the kernel."""

    class Described:
        def __init__(self, array):
            self.__cuda_array_interface__ = {"shape": array.shape, "typestr": array.dtype.str,
                                             "data": (0, False), "version": 3}

    p = tree_rnn_params(HIDDEN, VOCAB, "float64", 4)
    described = rj.DeviceParams(**{name: Described(getattr(p, name)) for name in p.names()})
    with pytest.raises(rj.InputError, match="parameter 'E' is a GPU array"):
        rnn_of_described_parameters.run(rj.Forest.from_nested([((1, 2), 3)]), described,
                                        backend="cuda")


def on_the_gpu(forest, dtype=None):
    """The forest with its float fields copied to the GPU (in `dtype`, if given)."""
    return rj.Forest(forest.child_ptr, forest.child_idx, forest.roots,
                     {name: cuda.to_device(values.astype(dtype or values.dtype))
                      if values.dtype.kind == "f" else values
                      for name, values in forest.fields.items()}, kind=forest.kind)


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@small
@given(forest=random_dags(features=HIDDEN, max_nodes=10), seed=seeds)
def test_float_fields_on_the_gpu_equal_reference(schedule, forest, seed):
    p = dag_rnn_params(HIDDEN, dtype="float64", seed=seed)
    assert_same_result(dag_rnn.run(on_the_gpu(forest), p, backend="cuda", schedule=schedule),
                       dag_rnn.reference(forest, p))


def test_a_gpu_field_is_put_in_the_linearized_order_on_the_device(monkeypatch):
    """The field stays out of the upload, which carries `old_of_new` instead; the grid's
    numbering is not the linearized one, so reading the field as given would be wrong."""
    forest = grids(2, HIDDEN, 3, 3, dtype="float64", seed=5)
    p = dag_rnn_params(HIDDEN, dtype="float64", seed=5)
    assert not np.array_equal(dag_rnn.linearize(forest).old_of_new,
                              np.arange(forest.num_nodes))
    uploaded, upload = [], DeviceBuffers.forest
    monkeypatch.setattr(DeviceBuffers, "forest", lambda self, arrays: (
        uploaded.append(sorted(arrays)), upload(self, arrays))[1])
    result = dag_rnn.run(on_the_gpu(forest), p, backend="cuda")
    assert "field_x" not in uploaded[0] and "old_of_new" in uploaded[0]
    assert_same_result(result, dag_rnn.reference(forest, p))


def test_explain_says_which_fields_stay_on_the_gpu():
    forest = on_the_gpu(grids(2, HIDDEN, 2, 2, dtype="float64", seed=12))
    text = dag_rnn.explain(forest, dag_rnn_params(HIDDEN, dtype="float64"), backend="cuda",
                           file=io.StringIO())
    assert "GPU fields x still in the forest's order" in text


def test_runs_alternating_host_and_gpu_fields_each_equal_reference():
    """One kernel, two uploads laid out differently: each run finds its own."""
    p = dag_rnn_params(HIDDEN, dtype="float64", seed=6)
    for seed, place in enumerate([lambda f: f, on_the_gpu] * 2):
        forest = grids(2, HIDDEN, 2, 3, dtype="float64", seed=seed)
        assert_same_result(dag_rnn.run(place(forest), p, backend="cuda"),
                           dag_rnn.reference(forest, p))


@rj.recursive_model(arity=2)
def matrix_field_rnn(node, p):
    """A matrix a node, read from a field: no weight, so no product from the runtime."""
    if node.is_leaf:
        return rj.tanh(node.M @ p.b)
    return rj.tanh(node.M @ (matrix_field_rnn(node.left, p) + matrix_field_rnn(node.right, p)))


def matrix_field_case():
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    rng = np.random.default_rng(7)
    forest = rj.Forest(forest.child_ptr, forest.child_idx, forest.roots,
                       {"M": rng.normal(size=(forest.num_nodes, HIDDEN, HIDDEN))})
    return forest, rj.Params(b=rng.normal(size=HIDDEN))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_a_kernel_that_calls_no_runtime_function_compiles_and_equals_reference(schedule):
    forest, p = matrix_field_case()
    check(matrix_field_rnn, forest, p, schedule)
    source = matrix_field_rnn.kernel_source("cuda")
    assert not any(line.endswith(" import") for line in source.splitlines())


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_a_scalar_parameter_equals_reference(schedule):
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = scaled_rnn_params(HIDDEN, VOCAB, seed=3)
    for params in (p, p.to_device()):
        assert_same_result(scaled_rnn.run(forest, params, backend="cuda", schedule=schedule),
                           scaled_rnn.reference(forest, p))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
@pytest.mark.parametrize("model", [child_mean, gated_child_list, max_pooled, min_pooled,
                                   tree_convolution],
                         ids=["the mean of node.children", "lists of the children's states",
                              "a running maximum", "a running minimum, the child first",
                              "a child's place"])
def test_a_cell_over_any_number_of_children_equals_reference(model, schedule):
    forest = rj.Forest.from_nested([((1, 2, 3), (4,), 5), 6, (7, (1, 2, 3, 4, 5), 6)])
    p = vector_rnn_params(HIDDEN, VOCAB, seed=6)
    assert_same_result(model.run(forest, p, backend="cuda", schedule=schedule),
                       model.reference(forest, p))


@rj.recursive_model(arity=2)
def absolute_rnn(node, p):
    """Python's, NumPy's and rj's abs, and square roots."""
    if node.is_leaf:
        return np.sqrt(abs(p.E[node.word]))
    return rj.tanh(p.W @ np.abs(absolute_rnn(node.left, p))
                   - rj.sqrt(rj.abs(absolute_rnn(node.right, p))))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_integer_powers_abs_and_sqrt_equal_reference(schedule):
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = scaled_rnn_params(HIDDEN, VOCAB, seed=5)
    for model in (powered_rnn, absolute_rnn):
        assert_same_result(model.run(forest, p, backend="cuda", schedule=schedule),
                           model.reference(forest, p))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_a_vector_times_a_parameter_and_a_transposed_parameter_equal_reference(schedule):
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = row_major_params(HIDDEN, VOCAB, seed=3, inputs=5)
    assert_same_result(row_major_rnn.run(forest, p, backend="cuda", schedule=schedule),
                       row_major_rnn.reference(forest, p))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_inner_products_weighting_any_number_of_children_equal_reference(schedule):
    forest = rj.Forest.from_nested([((1, 2, 3), (4, 5)), (6, 7, 8, 9), 3])
    p = attentive_params(HIDDEN, VOCAB, seed=6)
    assert_same_result(attentive_child_sum.run(forest, p, backend="cuda", schedule=schedule),
                       attentive_child_sum.reference(forest, p))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_matrix_states_times_parameters_read_transposed_equal_reference(schedule):
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = transposed_mv_params(HIDDEN, VOCAB, seed=4)
    assert_same_result(transposed_mv_rnn.run(forest, p, backend="cuda", schedule=schedule),
                       transposed_mv_rnn.reference(forest, p))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_a_float_scalar_field_is_a_number_per_node_on_the_host_or_the_gpu(schedule):
    forest = with_time_steps(rj.Forest.from_sequences([5, 3], fields={"word": np.arange(8)}),
                             seed=2)
    on_gpu = rj.Forest(forest.child_ptr, forest.child_idx, forest.roots, kind=forest.kind,
                       fields={**forest.fields, "dt": cuda.to_device(forest.fields["dt"])})
    p = scaled_rnn_params(HIDDEN, VOCAB, seed=2)
    expected = time_aware_rnn.reference(forest, p)
    for given_forest in (forest, on_gpu):
        assert_same_result(time_aware_rnn.run(given_forest, p, backend="cuda",
                                              schedule=schedule), expected)


def test_a_python_number_parameter_takes_the_arrays_dtype_on_the_device_too():
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = scaled_rnn_params(HIDDEN, VOCAB, seed=5)
    single = rj.Params(E=p.E.astype(np.float32), W=p.W.astype(np.float32), alpha=0.25)
    on_device = single.to_device()
    assert on_device.alpha.dtype == np.float32
    expected = scaled_rnn.reference(forest, single)
    for params in (single, on_device):
        result = scaled_rnn.run(forest, params, backend="cuda")
        assert result.roots[0].dtype == np.float32
        assert_same_result(result, expected, rtol=1e-5)


@rj.recursive_model(arity=2)
def overflowing(node, p):
    """exp overflows to inf, log of 0 and of negatives gives -inf and NaN, so does sqrt of
    negatives, sigmoid saturates."""
    if node.is_leaf:
        return rj.exp(p.E[node.word] * p.scale)
    left = overflowing(node.left, p)
    return (rj.log(left - p.shift) + rj.sigmoid(-left) + overflowing(node.right, p)
            + rj.sqrt(p.shift - left))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED], ids=["fused", "unfused"])
def test_infinities_and_nans_come_out_where_the_reference_has_them(schedule):
    forest = rj.Forest.from_nested([((1, 2), (3, 4)), 0])
    p = rj.Params(E=np.linspace(-1.0, 1.0, 15).reshape(5, 3), scale=np.float64(800.0),
                  shift=np.float64(1.0))
    with np.errstate(all="ignore"):
        expected = overflowing.reference(forest, p)
    assert any(not np.isfinite(state).all() for state in expected.nodes)
    result = overflowing.run(forest, p, backend="cuda", schedule=schedule)
    for got, want in zip(result.nodes, expected.nodes):
        np.testing.assert_allclose(got, want, rtol=1e-5)  # NaN matches NaN, inf matches inf


def test_a_vector_field_of_integers_is_computed_on_in_the_parameters_dtype():
    forest = grids(1, HIDDEN, 3, 2, dtype="float64", seed=2)
    forest.fields["x"] = np.round(4 * forest.fields["x"]).astype(np.int64)
    check(dag_rnn, forest, dag_rnn_params(HIDDEN, dtype="float64", seed=2))


@pytest.mark.parametrize("schedule", [FUSED, UNFUSED, rj.Schedule(unroll=2)],
                         ids=["fused", "unfused", "unrolled"])
def test_a_matrix_field_on_the_gpu_equals_reference(schedule):
    forest, p = matrix_field_case()
    assert_same_result(matrix_field_rnn.run(on_the_gpu(forest), p, backend="cuda",
                                            schedule=schedule),
                       matrix_field_rnn.reference(forest, p))


def test_the_cpu_backend_and_the_reference_read_device_parameters_copied_to_the_host():
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", seed=4)
    expected = tree_lstm.reference(forest, p)
    assert_same_result(tree_lstm.run(forest, p.to_device()), expected)
    assert_same_result(tree_lstm.reference(forest, p.to_device()), expected)


def test_the_cpu_backend_and_the_reference_read_gpu_fields_copied_to_the_host():
    forest = grids(2, HIDDEN, 3, 2, dtype="float64", seed=8)
    p = dag_rnn_params(HIDDEN, dtype="float64", seed=8)
    assert_same_result(dag_rnn.run(on_the_gpu(forest), p), dag_rnn.reference(forest, p))
    assert_same_result(dag_rnn.reference(on_the_gpu(forest), p), dag_rnn.reference(forest, p))


def test_check_finite_names_the_node_of_a_nan_in_a_gpu_field():
    forest = grids(2, HIDDEN, 2, 2, dtype="float64", seed=9)
    forest.fields["x"][3, 1] = np.nan
    with pytest.raises(rj.InputError, match=r"field 'x' holds nan at node 3"):
        dag_rnn.run(on_the_gpu(forest), dag_rnn_params(HIDDEN, dtype="float64"),
                    backend="cuda", check_finite=True)


def test_a_gpu_field_in_another_dtype_than_the_kernels_is_refused_naming_it():
    forest = on_the_gpu(grids(2, HIDDEN, 2, 2, dtype="float64", seed=10), "float32")
    with pytest.raises(rj.InputError, match="field 'x' is a float32 array on the device"):
        dag_rnn.run(forest, dag_rnn_params(HIDDEN, dtype="float64"), backend="cuda")


def test_an_integer_field_on_the_gpu_is_refused_naming_it():
    with pytest.raises(rj.InputError, match="field 'word' is a int64 array on the GPU"):
        rj.Forest.from_edges(3, [(0, 1), (0, 2)],
                             fields={"word": cuda.to_device(np.arange(3, dtype=np.int64))})


def test_a_gpu_field_of_the_wrong_length_is_refused_naming_it():
    with pytest.raises(rj.InputError, match=r"field 'x' has shape \(2, 4\)"):
        rj.Forest.from_edges(3, [(0, 1), (0, 2)], fields={"x": cuda.to_device(np.ones((2, 4)))})


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="the simulator takes NumPy arrays only")
def test_fields_exposing_the_cuda_array_interface_are_read_in_place():
    forest = grids(2, HIDDEN, 3, 3, dtype="float64", seed=11)
    p = dag_rnn_params(HIDDEN, dtype="float64", seed=11)
    foreign = rj.Forest(forest.child_ptr, forest.child_idx, forest.roots,
                        {"x": Foreign(cuda.to_device(forest.fields["x"]))}, kind="dag")
    assert_same_result(dag_rnn.run(foreign, p, backend="cuda"), dag_rnn.reference(forest, p))


@pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="this machine has a GPU")
def test_without_a_gpu_or_the_simulator_backend_cuda_says_what_it_needs():
    """And so does copying parameters to the device, which numba would refuse with its own
    CudaSupportError."""
    program = ("import sys; sys.path.insert(0, 'examples'); import recjit as rj\n"
               "from tree_rnn import tree_rnn, make_params\n"
               "try:\n"
               "    tree_rnn.run(rj.Forest.from_nested([(1, 2)]), make_params(3, 5, 'float64'),"
               " backend='cuda')\n"
               "except rj.RecJitError as error:\n"
               "    print(error)\n"
               "try:\n"
               "    make_params(3, 5, 'float64').to_device()\n"
               "except rj.RecJitError as error:\n"
               "    print(error)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    output = subprocess.run([sys.executable, "-c", program], cwd=root, env=environment,
                            capture_output=True, text=True, timeout=120, check=False).stdout
    assert "backend='cuda' needs an NVIDIA GPU" in output
    assert "Params.to_device() needs an NVIDIA GPU" in output
    assert "NUMBA_ENABLE_CUDASIM=1" in output
