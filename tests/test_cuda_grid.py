"""The fused CUDA kernels on grids of several blocks, as a GPU runs them: the weight rows split
over blocks (some owning fewer rows, or none), each block's slice kept in its shared memory,
the grid barriers between phases. Without a GPU, numba's simulator runs one block per
cooperative launch, so these tests patch it to run the blocks at once (`simulated_grid`); on
a GPU, the other CUDA tests already run on every multiprocessor."""
import contextlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import cuda

import recjit as rj
from recjit import codegen_cuda
from recjit.codegen_cuda import device, runtime
from recjit.codegen_cuda.packs import block_packs
from recjit.codegen_cuda.units import UnitSplit, split_units
from recjit.lowering.ilir import Loop, MatMul, RangeShare, Var, walk
from dag_rnn import dag_rnn, grids, make_params as dag_rnn_params
from lstm import lstm, make_params as lstm_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from tree_fc import make_params as tree_fc_params, tree_fc
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_rnn import make_params as tree_rnn_params, tree_rnn
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm

from conftest import assert_same_result, binary_forests, nary_forests, seeds, word_sequences

pytestmark = pytest.mark.skipif(not device.simulated(), reason="a GPU runs real grids")
# Seconds that block b sleeps, times b, after each block barrier in the tests that lag.
LAG = 0.003

VOCAB = 12
# structure: (a forest of it, random forests of it)
STRUCTURES = {
    "binary": (rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7), 8]),
               binary_forests(VOCAB, max_trees=3, max_leaves=5)),
    "child-sum": (rj.Forest.from_nested([(1, (2, 3, 4), 5), ((6, 7), 8)]),
                  nary_forests(VOCAB, max_trees=3, max_leaves=5, max_children=3)),
    "sequences": (rj.Forest.from_sequences([4, 2], fields={"word": np.array([1, 2, 3, 4, 5, 6])}),
                  word_sequences(VOCAB, max_length=5, max_sequences=2))}
ZOO = {"tree_lstm": (tree_lstm, tree_lstm_params, "binary"),
       "tree_fc": (tree_fc, tree_fc_params, "binary"),
       "mv_rnn": (mv_rnn, mv_rnn_params, "binary"),
       "tree_gru": (tree_gru, tree_gru_params, "child-sum"),
       "child_sum_tree_lstm": (child_sum_tree_lstm, tree_lstm_params, "child-sum"),
       "lstm": (lstm, lstm_params, "sequences")}


@contextlib.contextmanager
def grid_of(count, model=None, warps=False, lag=0.0):
    """Kernels of `model` compiled inside launch fused grids of `count` blocks, which the
    simulator runs at once (kernels compiled before, for its one block, are set aside); with
    `warps`, their products are a GPU's, a warp per output summed by shuffles; with a `lag`,
    block b sleeps b · lag seconds after each block barrier."""
    from simulated_grid import concurrent_blocks
    with pytest.MonkeyPatch.context() as patch, concurrent_blocks(lag):
        patch.setattr(device, "multiprocessors", lambda: count)
        patch.setattr(device.CooperativeLaunch, "max_blocks", lambda _: count)
        if model is not None:
            patch.setattr(model, "_compiled", {})
        if warps:
            patch.setattr(runtime, "products_of_four", runtime.warp_products)
            patch.setattr(runtime, "ITEM_WORKERS", runtime.WARP)
        yield


@contextlib.contextmanager
def tiles_of(nodes):
    """Fused kernels compiled inside stage the inputs of `nodes` nodes a tile, at most."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codegen_cuda.plan, "TILE_NODES", (nodes, 4))
        yield


@contextlib.contextmanager
def balance_of(value):
    """Fused kernels compiled inside split a batch's nodes in ranges as though each node's
    input column stood for `value` weight elements (few: many ranges at small batches)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codegen_cuda.ranges, "balance", lambda *_: value)
        yield


def check(count, model, forest, p, schedule=None, warps=False, lag=0.0):
    with grid_of(count, model, warps, lag):
        result = model.run(forest, p, backend="cuda", schedule=schedule)
        assert model.compile(forest, p, "cuda", schedule).backend_kernel.blocks == count
    assert_same_result(result, model.reference(forest, p))


@cuda.jit
def _rotate_through_the_grid(values, rotated, owner):
    marks = cuda.shared.array(1, np.int64)
    if cuda.threadIdx.x == 0:
        marks[0] = cuda.blockIdx.x
    index = cuda.grid(1)
    values[index] = index
    cuda.cg.this_grid().sync()
    rotated[index] = values[(index + 37) % values.shape[0]]
    owner[index] = marks[0]


def test_the_simulated_grid_syncs_every_block_and_gives_each_its_shared_memory():
    values, rotated, owner = (np.zeros(96, np.int64) for _ in range(3))
    with grid_of(3):
        _rotate_through_the_grid[3, 32](values, rotated, owner)
    np.testing.assert_array_equal(rotated, (np.arange(96) + 37) % 96)
    np.testing.assert_array_equal(owner, np.repeat(np.arange(3), 32))


@pytest.mark.parametrize("hidden, count", [(3, 3), (5, 4), (3, 11)],
                         ids=["even", "uneven", "idle blocks"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_models_on_several_blocks_equal_reference(name, hidden, count):
    """3 blocks own 1 of 3 rows each; 4 blocks own 2, 2, 1 and 0 of 5 rows; 11 blocks own
    one of 3 or 9 rows, or none."""
    model, make_params, structure = ZOO[name]
    forest, _ = STRUCTURES[structure]
    check(count, model, forest, make_params(hidden, VOCAB, "float64", 1))


def test_dag_rnn_on_several_blocks_equals_reference():
    forest = grids(2, 4, 3, 3, dtype="float64", seed=2)
    check(3, dag_rnn, forest, dag_rnn_params(4, dtype="float64", seed=2))


@pytest.mark.parametrize("name", ["tree_lstm", "tree_gru", "mv_rnn", "lstm"])
def test_the_backward_on_several_blocks_that_run_apart_gives_the_cpus_gradients(name):
    """Each block computes the adjoint's products and elementwise ops of its own units (its
    rows of the transposed weights kept on chip), and blocks that lag read the cotangents
    the others sent only after the grid met."""
    from test_gradients import assert_same_gradients
    model, make_params, structure = ZOO[name]
    forest, _ = STRUCTURES[structure]
    p = make_params(4, VOCAB, "float64", 1)
    out, cpu = model.vjp(forest, p)
    roots = tuple(np.random.default_rng(2).normal(size=state.shape) for state in out.roots)
    with grid_of(3, model, lag=LAG), pytest.MonkeyPatch.context() as patch:
        patch.setattr(model, "_adjoints", {})
        _, gpu = model.vjp(forest, p, backend="cuda")
        assert gpu.compiled.blocks == 3
        assert_same_gradients(gpu(roots=roots), cpu(roots=roots))


@settings(max_examples=10)
@given(name=st.sampled_from(sorted(ZOO)), count=st.integers(2, 4), persistence=st.booleans(),
       split_units=st.booleans(), stage_products=st.booleans(), row_groups=st.booleans(),
       block_packs=st.booleans(),
       shared_tiles=st.booleans(), node_ranges=st.booleans(), unroll=st.integers(1, 3),
       refactor=st.sampled_from([None, True, False]), specialize=st.booleans(), data=st.data(),
       seed=seeds)
def test_fused_schedules_on_several_blocks_equal_reference(name, count, persistence,
                                                           split_units, stage_products,
                                                           row_groups,
                                                           block_packs, shared_tiles,
                                                           node_ranges, unroll, refactor,
                                                           specialize, data, seed):
    """Hidden size 3: a balance of 3 or so, so batches of 2 nodes or more split in ranges."""
    model, make_params, structure = ZOO[name]
    _, forests = STRUCTURES[structure]
    schedule = rj.Schedule(persistence=persistence, split_units=split_units,
                           stage_products=stage_products, row_groups=row_groups, block_packs=block_packs,
                           shared_tiles=shared_tiles, node_ranges=node_ranges, unroll=unroll,
                           refactor=refactor,
                           specialize=specialize)
    check(count, model, data.draw(forests), make_params(3, VOCAB, "float64", seed),
          schedule, lag=LAG)


@pytest.mark.parametrize("hidden", [7, 33], ids=["a lane per output", "a warp per output"])
def test_the_gpus_warp_products_on_several_blocks_equal_reference(hidden):
    """A GPU's products: outputs of 32 columns or more summed across a warp's lanes (33: the
    first lane takes two columns)."""
    forest = rj.Forest.from_nested([((1, 2), 3)])
    check(3, tree_lstm, forest, tree_lstm_params(hidden, VOCAB, "float64", 4), warps=True)


@pytest.mark.parametrize("warps", [False, True], ids=["a thread per item", "a warp per item"])
def test_products_staged_in_several_tiles_on_several_blocks_equal_reference(warps):
    """Batches of 48 and 24 nodes (3 perfect trees of height 5) over 3 blocks: their products
    are staged through a tile of 32 nodes in two turns, each block starting at a tile of its
    own; a simulated block's 32 threads are one warp, so the GPU's choice stages them too."""
    forest = rj.Forest.perfect(5, num_trees=3)
    p = tree_fc_params(4, 1000, "float64", 5)
    schedule = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(3, tree_fc):
        kernel = tree_fc.compile(forest, p, "cuda", schedule).backend_kernel
        assert kernel.plan.tile[0] == 32 and "x_tile" in kernel.source
    check(3, tree_fc, forest, p, schedule, warps=warps, lag=LAG)


@pytest.mark.parametrize("warps", [False, True], ids=["a thread per item", "a warp per item"])
def test_products_split_in_row_groups_on_several_blocks_equal_reference(warps):
    """MV-RNN's 8-row weights on 5 blocks: two groups of four rows, each group's nodes in two
    ranges, the fifth block idle; W_M multiplies 8 inputs a node, which a warp a block stages
    through the tile. The weights are read from global memory, not kept in shared memory."""
    p = mv_rnn_params(8, VOCAB, "float64", 6)
    forest, _ = STRUCTURES["binary"]
    staged = rj.Schedule(stage_products=True)
    with grid_of(5, mv_rnn):
        kernel = mv_rnn.compile(forest, p, "cuda", staged).backend_kernel
        assert kernel.plan.row_groups == {"p_W", "p_W_M"}
        assert "row_groups_plan(p_W_M.shape[0], " in kernel.source
        assert "shared_p_W" not in kernel.source
        assert "groups of four rows" in kernel.describe()
    check(5, mv_rnn, forest, p, staged, warps=warps, lag=LAG)


def test_unstaged_products_split_in_row_groups_equal_reference():
    """The default, unstaged: each warp of a group reads its nodes' inputs directly."""
    p = mv_rnn_params(8, VOCAB, "float64", 6)
    forest, _ = STRUCTURES["binary"]
    with grid_of(5, mv_rnn):
        kernel = mv_rnn.compile(forest, p, "cuda").backend_kernel
        assert kernel.plan.row_groups == {"p_W", "p_W_M"}
        assert "matmul_row_groups(p_W_M, p_W_M.shape[0], " in kernel.source
    check(5, mv_rnn, forest, p, lag=LAG)


def test_too_few_blocks_for_two_ranges_a_group_split_the_rows_evenly():
    """8 rows in two groups need 4 blocks for two ranges of nodes each; 3 split them evenly."""
    p = mv_rnn_params(8, VOCAB, "float64", 7)
    forest, _ = STRUCTURES["binary"]
    staged = rj.Schedule(stage_products=True)
    with grid_of(3, mv_rnn):
        kernel = mv_rnn.compile(forest, p, "cuda", staged).backend_kernel
        assert not kernel.plan.row_groups and "rows_plan(" in kernel.source
        assert "row_groups_plan(" not in kernel.source
    check(3, mv_rnn, forest, p, staged)


@pytest.mark.parametrize("warps", [False, True], ids=["a thread per item", "a warp per item"])
def test_packs_each_block_computes_in_its_tile_on_several_blocks_equal_reference(warps):
    """Unrefactored TreeRNN packs both children's states in one loop, for W and for U: each
    block packs each product's inputs in its tile itself (batches of 24 and 12 nodes, tiles
    of 8 on 3 blocks, two of which lag), and no grid barrier comes before the products."""
    forest = rj.Forest.perfect(4, num_trees=3)
    p = tree_rnn_params(5, 1000, "float64", 8)
    schedule = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(3, tree_rnn), tiles_of(8):
        kernel = tree_rnn.compile(forest, p, "cuda", schedule).backend_kernel
        assert kernel.plan.packs.arrays == {"batch_x_W", "batch_x_U"}
        assert "grid.sync()  # barrier: the products read the packed inputs" not in kernel.source
        assert "multiply_tile((shared_p_U if ranges == 1 else p_U), " in kernel.source
        assert "batch_x_W" not in kernel.source.split("def scratch_shapes")[1]
        packed = {product.x for statement in walk(kernel.planned.body)
                  for product in getattr(statement, "products", (statement,))
                  if isinstance(product, MatMul) and product.pack is not None}
        assert packed == {"batch_x_U", "batch_x_W"}
        check(3, tree_rnn, forest, p, schedule, warps=warps, lag=LAG)


@pytest.mark.parametrize("warps", [False, True], ids=["a thread per item", "a warp per item"])
def test_a_pack_of_a_row_per_child_each_block_computes_in_its_tile_equals_reference(warps):
    """Unrefactored TreeLSTM packs U_f's inputs a row per child (rows 2·slot and 2·slot + 1):
    each block packs them in its tile, a tile row the child it stands for (batches of 24 and
    12 nodes, 48 and 24 rows of U_f, tiles of 8 that split no node's pair of rows or do, on
    3 blocks that lag); no grid barrier comes before the products."""
    forest = rj.Forest.perfect(4, num_trees=3)
    p = tree_lstm_params(5, 1000, "float64", 11)
    schedule = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(3, tree_lstm), tiles_of(7):
        kernel = tree_lstm.compile(forest, p, "cuda", schedule).backend_kernel
        assert kernel.plan.packs.arrays == {"leaf_x_W_iou", "batch_x_U_iou", "batch_x_U_f"}
        assert "part = packed_row % 2" in kernel.source
        assert "grid.sync()  # barrier: the products read the packed inputs" not in kernel.source
        check(3, tree_lstm, forest, p, schedule, warps=warps, lag=LAG)


@pytest.mark.parametrize("warps", [False, True], ids=["a thread per item", "a warp per item"])
def test_products_packed_by_one_loop_share_their_tiles_and_equal_reference(warps):
    """Unrefactored TreeLSTM packs U_iou's inputs (a row a node) and U_f's (a row a child) in
    one loop: each block fills its tiles with U_iou's rows, then U_f's, and multiplies each
    product's part of a tile (batches of 12, 6 and 3 nodes, 36, 18 and 9 rows, tiles of 5,
    so that a tile holds the last rows of one and the first of the other; 3 blocks that
    lag)."""
    forest = rj.Forest.perfect(3, num_trees=3, vocab_size=VOCAB)
    p = tree_lstm_params(4, VOCAB, "float64", 13)
    schedule = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(3, tree_lstm), tiles_of(5):
        source = tree_lstm.compile(forest, p, "cuda", schedule).backend_kernel.source
        assert "batch_x_U_iou, batch_x_U_f in x_tile itself, in the same tiles" in source
        assert "tile_part(rows_U_iou, rows_U_f, tile_first, tile_rows)" in source
        check(3, tree_lstm, forest, p, schedule, warps=warps, lag=LAG)


def test_without_shared_tiles_each_packed_product_fills_tiles_of_its_own():
    """`Schedule(shared_tiles=False)`: TreeLSTM's U_iou and U_f, packed by one loop, each
    pack and multiply their own tiles, one after the other (the ablation baseline)."""
    forest = rj.Forest.perfect(3, num_trees=3, vocab_size=VOCAB)
    p = tree_lstm_params(4, VOCAB, "float64", 14)
    unshared = rj.Schedule(refactor=False, stage_products=True, shared_tiles=False)
    with grid_of(3, tree_lstm), tiles_of(5):
        source = tree_lstm.compile(forest, p, "cuda", unshared).backend_kernel.source
        assert "in the same tiles" not in source and "tile_part" not in source
        assert source.count("# each block packs its nodes' inputs of batch_x_U") == 2
        check(3, tree_lstm, forest, p, unshared, lag=LAG)


def test_a_pack_of_products_of_a_blocks_own_units_is_the_grids():
    """TreeGRU packs Σ r_k ⊙ h_k from refactored products that each block computed for its
    own units alone: no block can pack every unit of it, so the grid packs it and meets."""
    p = tree_gru_params(5, VOCAB, "float64", 9)
    forest, _ = STRUCTURES["child-sum"]
    refactored = rj.Schedule(refactor=True, stage_products=True)
    with grid_of(3, tree_gru):
        kernel = tree_gru.compile(forest, p, "cuda", refactored).backend_kernel
        assert "batch_x_U_h" not in kernel.plan.packs.arrays and kernel.plan.packs.arrays
        assert "grid.sync()  # barrier: the products read the packed inputs" in kernel.source
    check(3, tree_gru, forest, p, refactored, lag=LAG)


@pytest.mark.parametrize("name", ["tree_gru", "child_sum_tree_lstm"])
def test_a_pack_of_a_row_per_edge_each_block_computes_in_its_tile_equals_reference(name):
    """Unrefactored child-sum models pack a row per edge (TreeGRU's U_r, child-sum TreeLSTM's
    U_f) besides the children's sum: each block packs both in its tile, a tile row the edge
    it stands for, whichever node it is (batches of 3 to 9 nodes of 1 to 3 children, tiles of
    4 on 3 blocks that lag); no grid barrier comes before those products."""
    model, make_params, _ = ZOO[name]
    forest = rj.Forest.from_nested([((1, 2, 3), (4, 5), 6), (((7, 8), 9, 10), 11, (12, 13, 14)),
                                    (15, (16, 17, 18))] * 3)
    p = make_params(5, 1000, "float64", 12)
    schedule = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(3, model), tiles_of(4):
        kernel = model.compile(forest, p, "cuda", schedule).backend_kernel
        assert any(array.startswith("batch_x_child_") for array in kernel.plan.packs.arrays)
        assert "edge = edge_base + packed_row" in kernel.source
        check(3, model, forest, p, schedule, lag=LAG)


def test_without_block_packs_the_grid_packs_and_meets_before_the_products():
    forest = rj.Forest.perfect(3, num_trees=2)
    p = tree_rnn_params(5, 1000, "float64", 10)
    schedule = rj.Schedule(refactor=False, stage_products=True, block_packs=False)
    with grid_of(3, tree_rnn):
        kernel = tree_rnn.compile(forest, p, "cuda", schedule).backend_kernel
        assert not kernel.plan.packs.arrays and "multiply_tile(" not in kernel.source
        assert "grid.sync()  # barrier: the products read the packed inputs" in kernel.source
    check(3, tree_rnn, forest, p, schedule)



def test_a_pack_loop_holding_a_product_that_writes_the_packed_rows_is_left_to_the_grid():
    """A block's pack is read off the pack loop's stores: a product inside the loop writing
    the same packed rows is a write that reading would never see, so neither product of
    TreeRNN's pack loop packs per block then."""
    forest = rj.Forest.perfect(3, num_trees=2)
    p = tree_rnn_params(5, 1000, "float64", 10)
    schedule = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(3, tree_rnn):
        compiled = tree_rnn.compile(forest, p, "cuda", schedule).backend_kernel
    kernel, tile_columns = compiled.kernel, compiled.plan.tile[1]
    split = split_units(kernel, compiled.weight_shapes)
    assert len(block_packs(kernel, split, tile_columns)[0].products) == 2
    pack = next(iter(compiled.plan.packs.products.values()))
    packed = next(iter(compiled.plan.packs.arrays))
    writer = MatMul("p_W", "state_0", packed, Var("count"), 32)

    def with_writer(body):
        return tuple(replace(statement, body=statement.body + (writer,)) if statement == pack.loop
                     else replace(statement, body=with_writer(statement.body))
                     if isinstance(statement, Loop) else statement for statement in body)

    changed = replace(kernel, body=with_writer(kernel.body))
    assert block_packs(changed, split_units(changed, compiled.weight_shapes),
                       tile_columns)[0].products == {}


# Models whose batches have a block barrier: (model, its parameters, its structure).
SPLIT_UNITS = {name: ZOO[name] for name in ("tree_lstm", "tree_fc", "tree_gru", "lstm")}


@pytest.mark.parametrize("name", sorted(SPLIT_UNITS))
def test_blocks_that_run_apart_after_block_barriers_still_equal_reference(name):
    """5 units over 3 blocks (2, 2 and 1); blocks 1 and 2 lag 3 and 6 ms after every block
    barrier, and each still reads only the rows it computed. TreeGRU's products of packed
    inputs, rewritten in every batch, are followed by a block barrier too: the grid meets
    before the next batch writes them."""
    model, make_params, structure = SPLIT_UNITS[name]
    forest, _ = STRUCTURES[structure]
    check(3, model, forest, make_params(5, VOCAB, "float64", 3), lag=LAG)


def test_lagging_blocks_expose_a_block_barrier_where_blocks_read_each_others_rows(monkeypatch):
    """The check above has teeth: with every barrier a block barrier, a block multiplies
    states that lagging blocks have not computed yet. What such a block reads is whatever the
    buffer held: a wrong root, or a value so large that the simulator's exp overflows."""
    monkeypatch.setattr(UnitSplit, "block_barrier", lambda split, body, index: True)
    forest, _ = STRUCTURES["binary"]
    p = tree_lstm_params(5, VOCAB, "float64", 3)
    with grid_of(3, tree_lstm, lag=LAG):
        try:
            root = tree_lstm.run(forest, p, backend="cuda").roots[0]
        except OverflowError:
            return
    assert not np.allclose(root, tree_lstm.reference(forest, p).roots[0])


# Forests whose batches 6 blocks split in several ranges at a balance of 4:
# (model, its parameters, a forest).
RANGED = {"tree_fc": (tree_fc, tree_fc_params, rj.Forest.perfect(4, num_trees=3)),
          "tree_lstm": (tree_lstm, tree_lstm_params, rj.Forest.perfect(4, num_trees=3)),
          "tree_gru": (tree_gru, tree_gru_params, rj.Forest.from_nested(
              [((1, 2, 3), (4, 5), 6), (((7, 8), 9, 10), 11, (12, 13, 14))] * 2)),
          "child_sum_tree_lstm": (child_sum_tree_lstm, tree_lstm_params, rj.Forest.from_nested(
              [((1, 2, 3), (4, 5), 6), (((7, 8), 9, 10), 11, (12, 13, 14))] * 2))}


@pytest.mark.parametrize("name", sorted(RANGED))
def test_batches_split_in_ranges_of_nodes_on_several_blocks_equal_reference(name):
    """At a balance of 4 on 6 blocks, a batch of 12 nodes is 4 ranges of 3 nodes, each
    range's 5 units on one block (two blocks idle); 6 nodes, 3 ranges of 2, units in groups
    of 3 and 2; 3 nodes, 2 ranges, units in groups of 2, 2 and 1. TreeFC and TreeLSTM
    multiply a row per node and a row per child, the child-sum models a row per edge (whose
    ranges follow the nodes'); unrefactored and staged, tiles of 2 nodes, and the blocks lag
    after block barriers."""
    model, make_params, forest = RANGED[name]
    p = make_params(5, 1000, "float64", 13)
    schedule = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(6, model), tiles_of(2), balance_of(4):
        kernel = model.compile(forest, p, "cuda", schedule).backend_kernel
        assert kernel.plan.ranges.products and "ranges = node_ranges(count, 4)" in kernel.source
        assert any(isinstance(statement, RangeShare) for statement in walk(kernel.planned.body))
        check(6, model, forest, p, schedule, lag=LAG)


@pytest.mark.parametrize("name", sorted(RANGED))
def test_unstaged_batches_split_in_ranges_of_nodes_equal_reference(name):
    """The default's products, unstaged, over ranges of nodes: each warp reads its range's
    inputs directly."""
    model, make_params, forest = RANGED[name]
    p = make_params(5, 1000, "float64", 13)
    schedule = rj.Schedule(refactor=False)
    with grid_of(6, model), balance_of(4):
        kernel = model.compile(forest, p, "cuda", schedule).backend_kernel
        assert kernel.plan.ranges.products and "ranges = node_ranges(count, 4)" in kernel.source
        check(6, model, forest, p, schedule, lag=LAG)


def test_a_dag_rnn_batch_split_in_ranges_reads_the_hoisted_products_of_every_unit():
    """DAG-RNN's hoisted products of W · x are split by units over every block; its ranged
    batches read each node's at the units of the block's group, which the grid met on."""
    forest = grids(3, 5, 4, 4, dtype="float64", seed=3)
    p = dag_rnn_params(5, dtype="float64", seed=3)
    unrefactored = rj.Schedule(refactor=False)
    with grid_of(6, dag_rnn), balance_of(2):
        assert dag_rnn.compile(forest, p, "cuda", unrefactored).backend_kernel.plan.ranges.products
        check(6, dag_rnn, forest, p, unrefactored, lag=LAG)


def test_refactored_products_leave_the_batches_unranged():
    """A parent reads its children's refactored products in the next batch, computed for
    the children's ranges, not its own: those batches split the units alone."""
    forest, _ = STRUCTURES["binary"]
    p = tree_lstm_params(5, VOCAB, "float64", 14)
    with grid_of(3, tree_lstm), balance_of(1):
        kernel = tree_lstm.compile(forest, p, "cuda", rj.Schedule(refactor=True)).backend_kernel
        assert not kernel.plan.ranges.products and "node_ranges(" not in kernel.source


def test_without_node_ranges_every_block_multiplies_every_node_of_a_batch():
    forest = rj.Forest.perfect(3, num_trees=2)
    p = tree_fc_params(5, 1000, "float64", 15)
    schedule = rj.Schedule(node_ranges=False, refactor=False, stage_products=True)
    with grid_of(3, tree_fc), balance_of(1):
        kernel = tree_fc.compile(forest, p, "cuda", schedule).backend_kernel
        assert "node_ranges(" not in kernel.source and "units_plan(" in kernel.source
    check(3, tree_fc, forest, p, schedule)


@pytest.mark.parametrize("asked, fit, blocks", [(2, 5, 2), (8, 3, 3)],
                         ids=["fewer than fit", "more than fit"])
def test_a_schedules_blocks_make_the_fused_grid_up_to_those_that_fit(asked, fit, blocks):
    forest, _ = STRUCTURES["binary"]
    p = tree_lstm_params(5, VOCAB, "float64", 16)
    schedule = rj.Schedule(blocks=asked)
    with grid_of(fit, tree_lstm):
        result = tree_lstm.run(forest, p, backend="cuda", schedule=schedule)
        assert tree_lstm.compile(forest, p, "cuda", schedule).backend_kernel.blocks == blocks
    assert_same_result(result, tree_lstm.reference(forest, p))


@pytest.mark.parametrize("warps", [False, True], ids=["a thread per item", "a warp per item"])
def test_a_transposing_pack_each_block_computes_in_its_tile_equals_reference(warps):
    """MV-RNN packs [B a; A b] for W and the columns of [A; B] for W_M, transposed, in one
    loop: each block packs both products' inputs in its tile itself (the tile's column c of
    row 8 · slot + j from the children's element 8 · c + j), so two grid barriers a batch
    are left, not three; on 5 blocks in row groups, two of which lag, tiles of 8 rows."""
    p = mv_rnn_params(8, 1000, "float64", 17)
    forest = rj.Forest.perfect(3, num_trees=2)
    staged = rj.Schedule(stage_products=True)
    with grid_of(5, mv_rnn, warps, LAG), tiles_of(8):
        kernel = mv_rnn.compile(forest, p, "cuda", staged).backend_kernel
        assert kernel.plan.packs.arrays == {"batch_x_W", "batch_x_W_M"}
        assert kernel.plan.tile[0] == 8 and "tile_column * 8" in kernel.source
        assert kernel.source.count("grid.sync()  # barrier") == 3  # hoisted, 2 a batch
        result = mv_rnn.run(forest, p, backend="cuda", schedule=staged)
    assert_same_result(result, mv_rnn.reference(forest, p))


def test_the_roots_are_gathered_after_the_last_batchs_grid_barrier_without_one_of_their_own():
    """An unrefactored TreeFC batch ends where the grid meets, the last batch too, so the
    gather of the roots' states that follows the batch loop needs no barrier of its own: on 3
    blocks that lag after the block barriers of their packs, the roots still equal the
    reference."""
    forest, _ = STRUCTURES["binary"]
    p = tree_fc_params(5, VOCAB, "float64", 6)
    unrefactored = rj.Schedule(refactor=False, stage_products=True)
    with grid_of(3, tree_fc, lag=LAG):
        source = tree_fc.compile(forest, p, "cuda", unrefactored).backend_kernel.source
        assert source.count("grid.sync()") == 2  # after the hoisted leaves, and a batch
        assert ("# no barrier: the grid met after the last writes, so the roots read the last "
                "batches' states") in source
        result = tree_fc.run(forest, p, backend="cuda", schedule=unrefactored)
    assert_same_result(result, tree_fc.reference(forest, p))
