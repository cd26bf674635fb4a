"""Scheduling primitives: every combination of `rj.Schedule` fields computes what the
naive recursion computes; unrolled and unbatched linearizations keep children before parents;
the compiler fills in what the user leaves open, and refuses what cannot apply."""
import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import recjit as rj
from dag_rnn import dag_rnn, grids, make_params as dag_rnn_params
from gru import gru, make_params as gru_params
from lstm import lstm, make_params as lstm_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from simple_tree_gru import simple_tree_gru
from tree_fc import make_params as tree_fc_params, tree_fc
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from conftest import assert_same_result, binary_forests, nary_forests, seeds, word_sequences

VOCAB = 12
HIDDEN = 3
BINARY = {"tree_fc": (tree_fc, tree_fc_params), "tree_rnn": (tree_rnn, tree_rnn_params),
          "tree_lstm": (tree_lstm, tree_lstm_params), "mv_rnn": (mv_rnn, mv_rnn_params)}
CHILD_SUM = {"tree_gru": (tree_gru, tree_gru_params),
             "simple_tree_gru": (simple_tree_gru, tree_gru_params),
             "child_sum_tree_lstm": (child_sum_tree_lstm, tree_lstm_params)}
SEQUENCES = {"gru": (gru, gru_params), "lstm": (lstm, lstm_params)}


def schedules(unroll=True):
    """Any combination of the scheduling primitives a CPU kernel takes."""
    return st.builds(rj.Schedule, dynamic_batching=st.booleans(), specialize=st.booleans(),
                     hoist=st.booleans(), unroll=st.integers(1, 3) if unroll else st.just(1),
                     refactor=st.sampled_from([None, True, False]),
                     pack_from_nodes=st.sampled_from([0, 64]))


def check(model, forest, p, schedule, backend="cpu"):
    assert_same_result(model.run(forest, p, backend=backend, schedule=schedule),
                       model.reference(forest, p))


# every combination equals the reference -----------------------------------------------
# Each new schedule compiles a kernel (seconds): few examples, many forests per kernel.
@settings(max_examples=10)
@given(name=st.sampled_from(sorted(BINARY)), schedule=schedules(),
       forest=binary_forests(VOCAB, max_trees=4, max_leaves=8), seed=seeds)
def test_every_schedule_of_a_binary_tree_model_equals_reference(name, schedule, forest, seed):
    model, make_params = BINARY[name]
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule)


@settings(max_examples=8)
@given(name=st.sampled_from(sorted(CHILD_SUM)), schedule=schedules(),
       forest=nary_forests(VOCAB, max_trees=3, max_leaves=8, max_children=4), seed=seeds)
def test_every_schedule_of_a_child_sum_model_equals_reference(name, schedule, forest, seed):
    model, make_params = CHILD_SUM[name]
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule)


@settings(max_examples=6)
@given(name=st.sampled_from(sorted(SEQUENCES)), schedule=schedules(),
       forest=word_sequences(VOCAB, max_length=12, max_sequences=3), seed=seeds)
def test_every_schedule_of_a_sequence_model_equals_reference(name, schedule, forest, seed):
    model, make_params = SEQUENCES[name]
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule)


@settings(max_examples=4)
@given(schedule=schedules(unroll=False), rows=st.integers(1, 4), cols=st.integers(1, 4),
       seed=seeds)
def test_every_schedule_of_the_dag_rnn_equals_reference(schedule, rows, cols, seed):
    forest = grids(2, HIDDEN, rows, cols, dtype="float64", seed=seed)
    check(dag_rnn, forest, dag_rnn_params(HIDDEN, dtype="float64", seed=seed), schedule)


@pytest.mark.parametrize("schedule", [
    rj.Schedule(refactor=False), rj.Schedule(refactor=True), rj.Schedule(specialize=False),
    rj.Schedule(dynamic_batching=False), rj.Schedule(refactor=False, fusion=False),
    rj.Schedule(specialize=False, refactor=True, fusion=False)],
    ids=["plain", "refactored", "unspecialized", "unbatched", "plain-unfused",
         "unspecialized-refactored-unfused"])
def test_cuda_schedules_equal_reference(schedule):
    forest = rj.Forest.from_nested([((1, (2, 3)), 4), (5, 6)])
    check(tree_gru, forest, tree_gru_params(HIDDEN, VOCAB, "float64", 3), schedule, "cuda")


def cuda_schedules():
    """Any combination of every field a CUDA kernel takes."""
    return st.builds(rj.Schedule, dynamic_batching=st.booleans(), specialize=st.booleans(),
                     hoist=st.booleans(), fusion=st.booleans(), persistence=st.booleans(),
                     split_units=st.booleans(), unroll=st.integers(1, 3),
                     refactor=st.sampled_from([None, True, False]))


# The simulator runs each GPU thread as a Python thread: few examples, small forests.
@settings(max_examples=8)
@given(name=st.sampled_from(sorted({**BINARY, **CHILD_SUM, **SEQUENCES})),
       schedule=cuda_schedules(), data=st.data(), seed=seeds)
def test_every_cuda_schedule_of_a_tree_or_sequence_model_equals_reference(name, schedule,
                                                                          data, seed):
    model, make_params = {**BINARY, **CHILD_SUM, **SEQUENCES}[name]
    forest = data.draw(binary_forests(VOCAB, max_trees=2, max_leaves=5) if name in BINARY
                       else nary_forests(VOCAB, max_trees=2, max_leaves=5, max_children=3)
                       if name in CHILD_SUM else word_sequences(VOCAB, max_length=6,
                                                                max_sequences=2))
    check(model, forest, make_params(HIDDEN, VOCAB, "float64", seed), schedule, "cuda")


# linearizations -----------------------------------------------------------------------
def parent_of(linearized):
    parent = np.full(linearized.num_nodes, -1)
    for node in range(linearized.num_nodes):
        parent[linearized.child_idx[linearized.child_ptr[node]:
                                    linearized.child_ptr[node + 1]]] = node
    return parent


def batch_of(linearized):
    return np.repeat(np.arange(linearized.num_batches), np.diff(linearized.batch_begin))


@settings(max_examples=30)
@given(forest=nary_forests(VOCAB, max_trees=4, max_leaves=12, max_children=3),
       depth=st.integers(2, 4))
def test_an_unrolled_item_is_a_subtree_whose_nodes_come_parents_first(forest, depth):
    linearized = tree_gru.linearize(forest, rj.Schedule(unroll=depth))
    parent, batch = parent_of(linearized), batch_of(linearized)
    item = np.repeat(np.arange(linearized.item_begin.size - 1),
                     np.diff(linearized.item_begin))
    for node in range(linearized.leaf_begin):
        if parent[node] >= 0:
            assert parent[node] < node
            same_batch = batch[parent[node]] == batch[node]
            assert not same_batch or item[parent[node]] == item[node]
            assert same_batch or batch[parent[node]] < batch[node]
    for b in range(linearized.num_batches - 1):
        first, end = linearized.batch_item[b], linearized.batch_item[b + 1]
        assert linearized.item_begin[first] == linearized.batch_begin[b]
        assert linearized.item_begin[end] == linearized.batch_begin[b + 1]


def test_unrolling_a_sequence_makes_items_of_consecutive_steps():
    forest = rj.Forest.from_sequences([7, 3], fields={"word": np.arange(10)})
    linearized = gru.linearize(forest, rj.Schedule(unroll=3))
    # internal steps 6 and 2: bands of heights 1-3, 4-6; the second sequence's 2 steps alone
    assert np.diff(linearized.item_begin).tolist() == [3, 3, 2]
    assert np.diff(linearized.batch_item).tolist() == [1, 2]


def test_without_dynamic_batching_every_internal_node_is_a_batch_of_its_own():
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5)])
    linearized = tree_rnn.linearize(forest, rj.Schedule(dynamic_batching=False))
    assert np.diff(linearized.batch_begin).tolist() == [1, 1, 1, 5]
    assert linearized.max_batch_size == 1


# generated code -----------------------------------------------------------------------
def test_an_unspecialized_kernel_branches_per_batch_and_hoists_no_leaves():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    p = tree_rnn_params(HIDDEN, VOCAB, "float64")
    source = tree_rnn.compile(forest, p, schedule=rj.Schedule(specialize=False)) \
        .backend_kernel.source
    assert "if begin >= leaf_begin:" in source
    assert "every leaf at once" not in source


def test_a_refactored_kernel_computes_child_products_after_each_state():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    text = tree_lstm.explain(forest, tree_lstm_params(HIDDEN, VOCAB, "float64"),
                             schedule=rj.Schedule(refactor=True), file=io.StringIO())
    assert "barrier: the refactored products read the states just computed" in text
    assert "proj_U_iou_0[begin + s, r] = Σ_k p_U_iou[r, k] · state_0[begin + s, k]" in text
    assert "barrier: the products read the packed inputs" not in text.split("for b in")[1]


def test_an_unrolled_kernel_has_one_barrier_per_batch():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    text = tree_rnn.explain(forest, tree_rnn_params(HIDDEN, VOCAB, "float64"),
                            schedule=rj.Schedule(unroll=2), file=io.StringIO())
    assert "barriers per batch: 1" in text
    assert "parallel for item in [0, (batch_item[(b + 1)] - first_item)) (one worker per " \
           "item):" in text


def bytes_moved(text):
    line = next(line for line in text.splitlines() if line.startswith("bytes moved"))
    weights = float(line.split(": ")[1].split(" KiB")[0])
    per_node = float(line.split("+ ")[1].split(" KiB")[0])
    return weights, per_node


def test_explain_estimates_the_bytes_a_batch_moves():
    """Refactored, a node reads its children's projections instead of packing their states
    and reading the products back; unrolled, every node streams the weights itself."""
    forest = rj.Forest.from_nested([((1, 2), 3)])
    p = tree_lstm_params(16, VOCAB, "float32")

    def explained(schedule):
        return bytes_moved(tree_lstm.explain(forest, p, schedule=schedule, file=io.StringIO()))

    plain_weights, plain_per_node = explained(rj.Schedule(refactor=False))
    assert plain_weights == (3 * 16 * 16 + 16 * 16) * 4 / 1024
    assert explained(rj.Schedule(refactor=True))[1] < plain_per_node
    assert explained(rj.Schedule(refactor=False, unroll=2))[1] > plain_per_node + plain_weights


# the compiler's choices ---------------------------------------------------------------
def chosen(model, forest, p, backend="cpu", schedule=None):
    return model.compile(forest, p, backend, schedule).schedule


def test_the_compiler_refactors_sequences_on_the_cpu_but_not_binary_trees():
    """On the CPU refactoring pays only where it adds no multiply-adds."""
    sequence = rj.Forest.from_sequences([3], fields={"word": [1, 2, 3]})
    tree = rj.Forest.from_nested([((1, 2), 3)])
    assert chosen(gru, sequence, gru_params(HIDDEN, VOCAB, "float64")).refactor is True
    assert chosen(tree_lstm, tree, tree_lstm_params(HIDDEN, VOCAB, "float64")).refactor is False


def test_on_the_gpu_the_compiler_refactors_where_it_removes_a_barrier_the_grid_meets_at():
    """Staged, a TreeLSTM batch meets as a grid once on the GPU, refactored or not:
    unrefactored, each block packs its products' inputs itself (block packs), and
    refactoring's extra products would buy nothing. Where the grid packs them (unstaged, the
    default, or without block packs), refactoring saves a grid barrier a batch; a GRU's saves
    them and adds no products."""
    tree = rj.Forest.from_nested([((1, 2), 3)])
    sequence = rj.Forest.from_sequences([3], fields={"word": [1, 2, 3]})
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    staged = rj.Schedule(stage_products=True)
    assert chosen(tree_lstm, tree, p, "cuda", staged).refactor is False
    assert chosen(tree_lstm, tree, p, "cuda", staged.but(block_packs=False)).refactor is True
    assert chosen(tree_lstm, tree, p, "cuda").refactor is True
    assert chosen(gru, sequence, gru_params(HIDDEN, VOCAB, "float64"), "cuda").refactor is True


def test_on_the_gpu_refactoring_is_chosen_per_forest_where_it_adds_multiply_adds():
    """With the grid packing the products' inputs, refactoring saves TreeGRU a grid barrier a
    batch and multiplies every node's state for its parent, leaves included: on ten perfect
    trees of 128 leaves that costs more than the barriers save; on one small tree not."""
    p = tree_gru_params(256, VOCAB, "float32")
    small, wide = rj.Forest.from_nested([((1, 2), 3)]), rj.Forest.perfect(7, num_trees=10)
    grid_packs = rj.Schedule(block_packs=False)
    assert chosen(tree_gru, small, p, "cuda", grid_packs).refactor is True
    assert chosen(tree_gru, wide, p, "cuda", grid_packs).refactor is False
    assert chosen(tree_gru, wide, p, "cuda", grid_packs.but(refactor=True)).refactor is True
    text = tree_gru.explain(wide, p, backend="cuda", schedule=grid_packs, file=io.StringIO())
    assert "refactor=False" in text and "(refactor chosen for this forest)" in text


def test_a_forest_run_unrefactored_by_the_gpus_choice_equals_reference(monkeypatch):
    from recjit.lowering import choose
    monkeypatch.setattr(choose, "MULTIPLY_ADDS_PER_US", 1.0)  # products dearer than barriers
    forest = rj.Forest.from_nested([(1, (2, 3, 4), 5), ((6, 7), 8)])
    p = tree_gru_params(HIDDEN, VOCAB, "float64", 3)
    grid_packs = rj.Schedule(block_packs=False)
    assert chosen(tree_gru, forest, p, "cuda", grid_packs).refactor is False
    assert_same_result(tree_gru.run(forest, p, backend="cuda", schedule=grid_packs),
                       tree_gru.reference(forest, p))


def test_on_the_gpu_staged_child_sum_models_meet_as_a_grid_no_more_often_unrefactored():
    """Staged, each block packs a child-sum batch's summed children and its rows per edge
    itself, so refactoring saves TreeGRU no grid barrier, and it runs unrefactored."""
    p = tree_gru_params(HIDDEN, VOCAB, "float64")
    forest = rj.Forest.from_nested([(1, (2, 3, 4), 5), ((6, 7), 8)])
    staged = rj.Schedule(stage_products=True)
    assert chosen(tree_gru, forest, p, "cuda", staged).refactor is False
    assert chosen(child_sum_tree_lstm, forest, tree_lstm_params(HIDDEN, VOCAB, "float64"),
                  "cuda", staged).refactor is False


def test_explain_prints_the_chosen_schedule():
    tree = rj.Forest.from_nested([((1, 2), 3)])
    text = tree_lstm.explain(tree, tree_lstm_params(HIDDEN, VOCAB, "float64"),
                             file=io.StringIO())
    assert "schedule: Schedule(dynamic_batching=True, specialize=True" in text
    assert "refactor=False" in text


# what cannot apply --------------------------------------------------------------------
def test_unrolling_a_dag_is_refused_naming_the_field():
    with pytest.raises(rj.ScheduleError, match="Schedule.unroll=2 applies to trees"):
        dag_rnn.run(grids(1, HIDDEN, 2, 2), dag_rnn_params(HIDDEN),
                    schedule=rj.Schedule(unroll=2))


@pytest.mark.parametrize("fields, message", [
    ({"unroll": 0}, "Schedule.unroll must be a positive integer"),
    ({"row_block": 2.5}, "Schedule.row_block must be a positive integer"),
    ({"pack_from_nodes": -1}, "Schedule.pack_from_nodes must be a non-negative integer"),
    ({"hoist": "yes"}, "Schedule.hoist must be True or False, not 'yes'"),
    ({"refactor": 1}, r"Schedule.refactor must be True or False or None"),
    ({"threads": 100}, "Schedule.threads must be a multiple of 32 up to 512"),
    ({"threads": 1024}, "Schedule.threads must be a multiple of 32 up to 512"),
    ({"blocks": 0}, "Schedule.blocks must be a positive integer"),
    ({"blocks": True}, "Schedule.blocks must be a positive integer")])
def test_a_malformed_schedule_is_refused_naming_the_field(fields, message):
    with pytest.raises(rj.ScheduleError, match=message):
        rj.Schedule(**fields)


def test_a_schedule_field_that_does_not_exist_is_refused_naming_the_closest():
    with pytest.raises(rj.ScheduleError, match="no field 'unrol'; did you mean 'unroll'"):
        rj.Schedule(unrol=2)
    with pytest.raises(rj.ScheduleError, match="no field 'unrol'; did you mean 'unroll'"):
        rj.Schedule().but(unrol=2)


def test_a_schedule_value_by_position_is_refused():
    """Schedule(False) would otherwise switch off whichever field comes first."""
    with pytest.raises(rj.ScheduleError, match="takes its fields by name"):
        rj.Schedule(False)
