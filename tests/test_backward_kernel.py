"""The compiled backward (`lowering.backward`) beyond the zoo's gradients (which
`test_gradients.py` checks against the adjoint NumPy evaluates, in the process that compiled
them): per-tree gradients, DAGs' shared children, and the kernel as `explain` and
`kernel_source` show it."""
import itertools
import re

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import recjit as rj
from dag_rnn import dag_rnn, make_params as dag_rnn_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm
from tree_attention import make_params as tree_attention_params, tree_attention
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from recjit.codegen_cpu import calls, runtime, sum_of_outer_products
from recjit.codegen_cpu.runtime import panel_width
from recjit.codegen_cpu.child_loops import children_after
from recjit.lowering.arguments import leaf_groups
from recjit.lowering.backward import gradient_sums
from recjit.lowering import ilir

from conftest import assert_same_gradients, attentive_child_sum, attentive_params, \
    random_dags, seeds
from test_gradients import HIDDEN, VOCAB, pullback_and_cotangents

few = settings(max_examples=3)


@few
@given(forest=st.sampled_from([0, 1]).map(
    lambda seed: rj.Forest.random_binary(3, seed=seed, mean_leaves=6, vocab_size=VOCAB)),
    seed=seeds)
def test_per_tree_gradients_from_the_compiled_backward_are_the_adjoints(forest, seed):
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", seed % 7)
    pullback, roots, nodes = pullback_and_cotangents(tree_lstm, forest, p, seed)
    got = pullback(roots=roots, nodes=nodes, per_tree=True)
    expected = pullback.interpreted()(roots=roots, nodes=nodes, per_tree=True)
    for name in ("W_iou", "U_iou", "U_f", "b_iou", "b_f"):
        np.testing.assert_allclose(getattr(got.params, name), getattr(expected.params, name),
                                   rtol=1e-10, atol=1e-12, err_msg=name)
    for own, theirs in zip(got.params.E, expected.params.E):
        np.testing.assert_allclose(np.asarray(own), np.asarray(theirs), rtol=1e-10, atol=1e-12)


@few
@given(forest=random_dags(HIDDEN, max_nodes=12), seed=seeds)
def test_a_dag_models_compiled_backward_gathers_what_every_parent_sent(forest, seed):
    p = dag_rnn_params(HIDDEN, dtype="float64", seed=seed % 7)
    pullback, roots, nodes = pullback_and_cotangents(dag_rnn, forest, p, seed)
    assert pullback.compiled is not None
    got = pullback(roots=roots, nodes=nodes)
    expected = pullback.interpreted()(roots=roots, nodes=nodes)
    for name in ("W", "U", "b"):
        np.testing.assert_allclose(getattr(got.params, name), getattr(expected.params, name),
                                   rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(got.fields["x"], expected.fields["x"], rtol=1e-10, atol=1e-12)


@rj.recursive_model(arity=2, kind="dag")
def binary_dag(node, p):
    """Two children each, which other nodes may share: the edge to each is its own row."""
    if node.is_leaf:
        return rj.tanh(p.W @ node.x)
    return rj.tanh(p.U @ binary_dag(node.left, p) + p.V @ binary_dag(node.right, p))


def test_a_fixed_arity_dag_node_that_has_one_child_twice_sends_it_both_parts():
    rng = np.random.default_rng(2)
    edges = [(0, 1), (0, 2), (1, 3), (1, 4), (2, 4), (2, 4)]  # node 2 reads node 4 twice
    forest = rj.Forest.from_edges(5, edges, {"x": rng.normal(size=(5, 2))})
    p = rj.Params(W=rng.normal(size=(HIDDEN, 2)), U=rng.normal(size=(HIDDEN, HIDDEN)) / 2,
                  V=rng.normal(size=(HIDDEN, HIDDEN)) / 2)
    out, pullback = binary_dag.vjp(forest, p)
    cotangent = rng.normal(size=out.roots[0].shape)
    got = pullback(roots=cotangent)
    expected = pullback.interpreted()(roots=cotangent)
    for name in ("W", "U", "V"):
        np.testing.assert_allclose(getattr(got.params, name), getattr(expected.params, name),
                                   rtol=1e-10, err_msg=name)
    np.testing.assert_allclose(got.fields["x"], expected.fields["x"], rtol=1e-10)


def test_explain_with_grad_shows_a_dags_nodes_gathering_from_their_parents():
    forest = rj.Forest.grid_dag(2, 2, fields={"x": np.ones((4, HIDDEN))})
    text = dag_rnn.explain(forest, dag_rnn_params(HIDDEN, dtype="float64", seed=0), grad=True)
    backward = text[text.index("== backward ILIR (cpu) =="):]
    assert "for parent in [parent_ptr[node], parent_ptr[(node + 1)])" in backward
    assert "edge_cot_0" in backward
    assert "the backward is one call of the numba parallel kernel" in backward


def test_kernel_source_with_grad_prints_the_backward_kernel_of_the_last_vjp():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    tree_lstm.vjp(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0))
    source = tree_lstm.kernel_source(grad=True)
    assert "def tree_lstm_backward(" in source
    assert "cot_0[child0, e] = cot_0[child0, e] +" in source.replace("(", "").replace(")", "")


def test_kernel_source_with_grad_prints_the_backward_explain_compiled_last():
    """As the forward's: `explain(grad=True)` compiles a backward, which is then the last."""
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    tree_rnn.vjp(forest, tree_rnn_params(HIDDEN, VOCAB, "float64", 0))
    assert "(float64, exact math)" in tree_rnn.kernel_source(grad=True)
    tree_rnn.explain(forest, tree_rnn_params(HIDDEN, VOCAB, "float32", 0), grad=True)
    assert "(float32, fast math)" in tree_rnn.kernel_source(grad=True)


def test_explain_with_grad_prints_the_backward_ilir_roots_first():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    text = tree_lstm.explain(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0), grad=True)
    backward = text[text.index("== backward ILIR (cpu) =="):]
    assert "for b in [0, (num_batches - 1)):" in backward
    assert "grad_U_iou" in backward and "batch_x_U_f_T" in backward
    assert "the backward is one call of the numba parallel kernel" in backward


def test_a_transposed_product_reads_its_vectors_where_the_weights_gradient_rows_hold_them():
    """`U_iouᵀ g`, whose g is also the first vector of U_iou's gradient, a row per node, reads
    those rows from the batch's first node on: no packed copy of g."""
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    text = tree_lstm.explain(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0), grad=True)
    backward = text[text.index("== backward ILIR (cpu) =="):]
    product = next(line for line in backward.splitlines() if "= Σ_k pT_U_iou[r, k]" in line)
    assert "batch_grad_U_iou_" in product and "_a[begin + s, k]" in product
    assert "batch_x_U_iou_T" not in backward


@rj.recursive_model(arity=2)
def scaled_mv_rnn(node, p):
    """MV-RNN with its matrix weight scaled first: a computed matrix times the children's
    matrices, whose cotangent reads their concatenation transposed."""
    if node.is_leaf:
        return p.E[node.word], p.E_M[node.word]
    a, A = scaled_mv_rnn(node.left, p)
    b, B = scaled_mv_rnn(node.right, p)
    return rj.tanh(p.W @ rj.concat([B @ a, A @ b])), (p.W_M * 0.5) @ rj.concat([A, B])


def test_a_product_down_two_childrens_matrices_sums_each_element_in_one_loop():
    """g [A; B]ᵀ, the cotangent of a computed matrix times the children's matrices one above
    the other, reads one child's row down the whole of k: one loop over all of k for each
    segment of a row, not one loop per term (MV-RNN's kernel at H = 64 was 33,000 lines so,
    and did not compile in 24 GB)."""
    hidden = 12
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    p = mv_rnn_params(hidden, VOCAB, "float64", 0)
    out, pullback = scaled_mv_rnn.vjp(forest, p)
    roots = tuple(np.ones_like(state) for state in out.roots)
    assert_same_gradients(pullback(roots=roots), pullback.interpreted()(roots=roots))
    source = scaled_mv_rnn.kernel_source("cpu", grad=True)
    sums = re.findall(r"for k\d+ in range\(([^)]*)\):", source)
    assert sums and set(sums) == {str(hidden)}


def test_a_weights_gradient_through_a_matrix_product_is_a_product_over_the_matrices_rows():
    """MV-RNN's W_M [A; B]: W_M's gradient Σ_k g[:, k] ⊗ [A; B][:, k] is a weight gradient
    over the rows of gᵀ and [A; B]ᵀ, a node's `hidden` rows each, multiplied over every
    node's rows after the kernel, not a product a node in it."""
    hidden = 6
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    out, pullback = mv_rnn.vjp(forest, mv_rnn_params(hidden, VOCAB, "float64", 0))
    pairs = [rows for rows in pullback.compiled.kernel.gradients if rows.attrs == ("W_M",)]
    assert [(rows.effect, rows.size, rows.vectors) for rows in pairs] == [
        ("grad_param_outer", hidden * hidden, hidden),
        ("grad_param_outer", hidden * 2 * hidden, hidden)]
    roots = tuple(np.ones_like(state) for state in out.roots)
    assert_same_gradients(pullback(roots=roots), pullback.interpreted()(roots=roots))


def test_the_transposed_concatenation_of_two_childrens_matrices_is_stored_a_loop_a_child():
    """[A; B]ᵀ, W_M's gradient's second side: each of its rows holds a column of A, then
    one of B. It is stored by a loop over its rows holding a loop over each child's part,
    not a loop per segment (two a row: 2 · `hidden` of them), and gives the adjoint's
    gradients."""
    hidden = 6
    forest = rj.Forest.random_binary(3, seed=0, mean_leaves=5, vocab_size=VOCAB)
    out, pullback = mv_rnn.vjp(forest, mv_rnn_params(hidden, VOCAB, "float64", 0))
    side = next(rows.name for rows in pullback.compiled.kernel.gradients
                if rows.attrs == ("W_M",) and rows.size == hidden * 2 * hidden)
    row_loops = [loop for loop in ilir.walk(pullback.compiled.kernel.body)
                 if isinstance(loop, ilir.Loop) and loop.role is ilir.LoopRole.ROWS]
    assert row_loops and all(loop.stop == ilir.Const(hidden) for loop in row_loops)
    for loop in row_loops:
        assert [(part.start, part.stop) for part in loop.body] == [
            (ilir.Const(0), ilir.Const(hidden)), (ilir.Const(hidden), ilir.Const(2 * hidden))]
        assert {store.array for store in ilir.nodes(loop.body, ilir.Store)} == {side}
    roots = tuple(np.ones_like(state) for state in out.roots)
    assert_same_gradients(pullback(roots=roots), pullback.interpreted()(roots=roots))


def test_the_backward_reads_the_products_the_forward_kept_by_default():
    forest = rj.Forest.random_binary(3, seed=0, mean_leaves=5, vocab_size=VOCAB)
    _, pullback = tree_lstm.vjp(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0))
    assert sorted(pullback.kept) == ["batch_kept_U_f", "batch_kept_U_iou", "leaf_kept_W_iou",
                                     "leaf_kept_x_W_iou"]
    internal = pullback.linearized.leaf_begin
    assert pullback.kept["batch_kept_U_iou"].shape == (internal, 3 * HIDDEN)
    words = np.unique(forest.fields["word"][forest.fields["word"] >= 0]).size
    assert pullback.kept["leaf_kept_W_iou"].shape == (words, 3 * HIDDEN)  # a row a word
    source = tree_lstm.kernel_source(grad=True)
    assert "batch_kept_U_iou[node, " in source and "batch_y_U_iou[" not in source
    assert "leaf_kept_W_iou[leaf_slot[slot], " in source and "leaf_y_W_iou[" not in source


def test_the_backward_reads_the_rows_its_forward_gathered_not_the_table():
    """The forward packs a leaf's gathered row for its product once a word; with the products
    kept, it keeps that pack, and the backward takes no table: nothing to check it against."""
    forest = rj.Forest.random_binary(3, seed=0, mean_leaves=5, vocab_size=VOCAB)
    _, pullback = tree_lstm.vjp(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0))
    words = np.unique(forest.fields["word"][forest.fields["word"] >= 0]).size
    assert pullback.kept["leaf_kept_x_W_iou"].shape == (words, HIDDEN)
    assert "p_E" in tree_lstm.kernel_source()
    assert "p_E" not in tree_lstm.kernel_source(grad=True)
    assert "leaf_kept_x_W_iou[leaf_slot[" in tree_lstm.kernel_source(grad=True)
    assert not pullback.guards
    assert "the rows its leaves gathered from `E`, so that the backward reads no table" in \
        tree_lstm.explain(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0), grad=True)


@pytest.mark.parametrize("model, make, forest", [
    (tree_lstm, tree_lstm_params, rj.Forest.random_binary(4, seed=1, vocab_size=VOCAB)),
    (child_sum_tree_lstm, tree_lstm_params,
     rj.Forest.from_nested([((1, 2, 3), (4, 5)), (0, (1, 2))])),
    (mv_rnn, mv_rnn_params, rj.Forest.random_binary(3, seed=2, vocab_size=VOCAB))],
    ids=["tree_lstm", "child_sum_tree_lstm", "mv_rnn"])
def test_recomputing_the_products_and_keeping_them_give_the_same_gradients(model, make,
                                                                           forest):
    p = make(HIDDEN, VOCAB, "float64", 3)
    _, kept = model.vjp(forest, p)
    out, recomputed = model.vjp(forest, p, schedule=rj.Schedule(remat=True))
    assert kept.kept and not recomputed.kept
    roots = tuple(np.random.default_rng(5).normal(size=state.shape) for state in out.roots)
    roots = roots if len(roots) > 1 else roots[0]
    got, expected = kept(roots=roots), recomputed(roots=roots)
    for name in p.names():
        np.testing.assert_allclose(np.asarray(getattr(got.params, name)),
                                   np.asarray(getattr(expected.params, name)),
                                   rtol=1e-10, atol=1e-12, err_msg=name)


def test_keeping_the_products_takes_no_unrolled_schedule():
    forest = rj.Forest.random_binary(2, seed=0, vocab_size=VOCAB)
    with pytest.raises(rj.ScheduleError, match="remat=False"):
        tree_lstm.vjp(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0),
                      schedule=rj.Schedule(remat=False, unroll=2))


def test_explain_with_grad_says_whether_the_forward_keeps_its_products():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 0)
    assert "remat: the forward keeps" in tree_lstm.explain(forest, p, grad=True)
    assert "remat: the backward recomputes" in tree_lstm.explain(
        forest, p, grad=True, schedule=rj.Schedule(remat=True))


CHILD_SUM_FOREST = rj.Forest.from_nested([((1, 2, 3), (4, (5, 0))), (0, 1, 2)])
FLOAT32_PANEL = panel_width(4)


def edge_loops_holding_element_loops(body):
    return [loop for loop in ilir.nodes(body, ilir.Loop)
            if loop.role is ilir.LoopRole.EDGES
            and any(inner.element for inner in ilir.nodes(loop.body, ilir.Loop))]


def test_a_child_sum_backward_runs_each_childs_part_after_the_nodes_child_by_child():
    """On the CPU, what a node sends each child leaves the loop over the node's elements:
    one loop over its edges, the elements innermost (`child_loops.py`)."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 3)
    pullback, roots, nodes = pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p,
                                                     3)
    backward = pullback.compiled
    assert backward.children_after
    assert not edge_loops_holding_element_loops(backward.kernel.body)
    assert edge_loops_holding_element_loops(backward.planned.body)
    assert "vals_v" in backward.source
    got = pullback(roots=roots, nodes=nodes)
    expected = pullback.interpreted()(roots=roots, nodes=nodes)
    for name in ("W_iou", "U_iou", "U_f", "b_iou", "b_f"):
        np.testing.assert_allclose(getattr(got.params, name), getattr(expected.params, name),
                                   rtol=1e-10, atol=1e-12, err_msg=name)


def test_the_adjoint_reads_a_value_its_case_computes_rather_than_computing_it_again():
    """A TreeGRU's `1 - z` is also the slope of its sigmoid, `1 - y`: one op, the case's."""
    p = tree_gru_params(HIDDEN, VOCAB, "float64", 3)
    pullback, _, _ = pullback_and_cotangents(tree_gru, CHILD_SUM_FOREST, p, 3)
    for adjoint in pullback.adjoints.values():
        keys = [(op.kind, op.args, op.attrs, op.shape) for op in adjoint.ops]
        seen = set(keys[:adjoint.forward])
        for key in keys[adjoint.forward:]:
            if not key[0].startswith("grad_"):
                assert key not in seen, key
                seen.add(key)


def test_the_adjoint_holds_no_op_that_no_effect_reads():
    """`1 - z`'s constant collects a cotangent that goes nowhere: no op sums it."""
    p = tree_gru_params(HIDDEN, VOCAB, "float64", 3)
    pullback, _, _ = pullback_and_cotangents(tree_gru, CHILD_SUM_FOREST, p, 3)
    for adjoint in pullback.adjoints.values():
        read = {argument for op in adjoint.ops for argument in op.args}
        for index, op in enumerate(adjoint.ops[adjoint.forward:], adjoint.forward):
            assert op.kind.startswith("grad_") or index in read, (index, op)


def test_a_split_values_cotangent_is_each_parts_own_with_no_zeros_added():
    """The adjoint of `rj.split` pads each part's cotangent with zeros: the backward stores
    each part where it belongs, not its sum with the other parts' zeros."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 3)
    pullback, roots, nodes = pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p,
                                                     3)
    assert "real(0.0) +" not in pullback.compiled.source
    assert "+ real(0.0)" not in pullback.compiled.source
    got = pullback(roots=roots, nodes=nodes)
    expected = pullback.interpreted()(roots=roots, nodes=nodes)
    for name in ("W_iou", "U_iou", "U_f", "b_iou", "b_f"):
        np.testing.assert_allclose(getattr(got.params, name), getattr(expected.params, name),
                                   rtol=1e-10, atol=1e-12, err_msg=name)


def element_loop(*body):
    return ilir.Loop("k", ilir.Const(0), ilir.Const(4), body, ilir.LoopRole.ELEMENTS)


def edge_loop(*body):
    node = ilir.Var("node")
    return ilir.Loop("edge", ilir.Load("child_ptr", (node,)),
                     ilir.Load("child_ptr", (ilir.add(node, 1),)),
                     (ilir.Let("child", ilir.Load("child_idx", (ilir.Var("edge"),))),) + body,
                     ilir.LoopRole.EDGES)


K, NODE, CHILD = ilir.Var("k"), ilir.Var("node"), ilir.Var("child")


def test_an_element_loop_is_split_where_each_part_reads_what_it_read_before():
    """A node's part reads the cotangent at its own row; the edge loop adds to the child's."""
    loop = element_loop(
        ilir.Let("g", ilir.Load("cot", (NODE, K))),
        edge_loop(ilir.Store("cot", (CHILD, K), ilir.BinOp("+", ilir.Load("cot", (CHILD, K)),
                                                           ilir.Var("g")))))
    split = children_after(loop)
    assert split != (loop,)
    assert edge_loops_holding_element_loops(split)


def test_a_childs_inner_product_goes_before_the_element_loop_once_a_child():
    score = ilir.Loop("j", ilir.Const(0), ilir.Const(4), (ilir.Let("s", ilir.BinOp(
        "+", ilir.Var("s"), ilir.Load("h", (CHILD, ilir.Var("j"))))),), ilir.LoopRole.DOT)
    loop = element_loop(edge_loop(
        ilir.Let("s", ilir.Const(0.0)), score,
        ilir.Store("cot", (CHILD, K), ilir.BinOp("*", ilir.Var("s"), ilir.Load("g", (K,))))))
    (edges,) = edge_loops_holding_element_loops(children_after(loop))
    assert edges.body[1:3] == (ilir.Let("s", ilir.Const(0.0)), score)
    assert edges.body[3].element


def test_an_edge_loop_whose_inner_loop_stores_into_a_row_it_did_not_allocate_stays_whole():
    """Storing once a child what the element loop stored once an element could change what
    an element reads."""
    loop = element_loop(edge_loop(ilir.Loop("j", ilir.Const(0), ilir.Const(4), (ilir.Store(
        "cot", (CHILD, ilir.Var("j")), ilir.Const(1.0)),), ilir.LoopRole.ELEMENTS)))
    assert children_after(loop) == (loop,)


def test_an_element_loop_is_left_whole_where_an_edge_loop_reads_what_the_node_writes():
    loop = element_loop(
        ilir.Store("x", (NODE, K), ilir.Const(1.0)),
        edge_loop(ilir.Store("y", (CHILD, K), ilir.Load("x", (NODE, ilir.add(K, 1))))))
    assert children_after(loop) == (loop,)


def merged_element_loops(body):
    return [inner for loop in edge_loops_holding_element_loops(body)
            for inner in ilir.nodes(loop.body, ilir.Loop) if inner.element]


def test_the_merged_edge_loop_computes_each_value_once():
    """The child's forget gate that three of child-sum TreeLSTM's edge loops computed is
    computed once in the loop they become, and read by all three."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 3)
    pullback, _, _ = pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 3)
    loops = merged_element_loops(pullback.compiled.planned.body)
    assert loops
    for loop in loops:
        values = [let.value for let in loop.body if isinstance(let, ilir.Let)]
        assert len(values) == len(set(values))


def test_a_sum_over_the_children_inside_a_childs_term_is_summed_into_a_row_first():
    """Attention's backward sums the children's weighted states again inside each child's
    term: that inner sum, too, goes into a row child by child, each child's score computed
    once a child rather than once an element."""
    lines, inner_sums = backward_lines(attentive_child_sum, attentive_params(5, VOCAB, 1),
                                       "for edge_1 ")
    for i in inner_sums:
        assert any(line.strip().startswith("sums_v") for line in block_after(lines, i))


def test_a_sum_over_the_children_inside_a_childs_term_is_computed_once_a_child():
    """That inner sum is the same for every element the child is sent: it is computed before
    the loop over them, not in it."""
    lines, inner_sums = backward_lines(attentive_child_sum, attentive_params(5, VOCAB, 1),
                                       "for edge_1 ")
    for i in inner_sums:  # the elements of a state are the loops of 5 around it
        assert not any(line.endswith(" in range(5):") for line in enclosing(lines, i))


def test_the_backward_computes_each_childs_score_once_a_child():
    """Attention's backward sends each child a part that reads the child's score, an inner
    product with its state: the score is computed once a child, before the loop over the
    elements that sends the part, not inside it."""
    lines, scores = backward_lines(tree_attention, tree_attention_params(5, VOCAB), "for k2 ")
    for i in scores:  # the elements of a state are the loops of 5 around it
        assert not any(line.endswith(" in range(5):") for line in enclosing(lines, i))


def backward_lines(model, p, opening):
    """The lines of `model`'s CPU backward kernel (hidden size 5) for a forest of two and
    three children a node, and the places of those that begin with `opening` (some)."""
    forest = rj.Forest.from_nested([((1, 2, 3), (4, 5)), (6, 7)])
    lines = model.kernel_source("cpu", forest, p, grad=True).splitlines()
    places = [i for i, line in enumerate(lines) if line.strip().startswith(opening)]
    assert places
    return lines, places


def indent(line):
    return len(line) - len(line.lstrip())


def block_after(lines, i):
    """The lines of the block that line `i` opens."""
    return itertools.takewhile(lambda line: indent(line) > indent(lines[i]), lines[i + 1:])


def enclosing(lines, i):
    """The lines that open the blocks around line `i`, innermost first."""
    depth, opened = indent(lines[i]), []
    for line in reversed(lines[:i]):
        if line.strip() and indent(line) < depth:
            opened.append(line.strip())
            depth = indent(line)
    return opened


def test_a_value_loaded_from_an_array_the_edge_loop_stores_is_loaded_again():
    loop = element_loop(edge_loop(
        ilir.Let("a", ilir.Load("cot", (CHILD, K))),
        ilir.Store("cot", (CHILD, K), ilir.BinOp("+", ilir.Var("a"), ilir.Const(1.0))),
        ilir.Let("b", ilir.Load("cot", (CHILD, K))),
        ilir.Store("y", (CHILD, K), ilir.Var("b"))))
    (merged,) = merged_element_loops(children_after(loop))
    assert ilir.Let("b", ilir.Load("cot", (CHILD, K))) in merged.body


def test_the_cpus_weight_gradients_are_rows_a_node_and_the_gpus_columns():
    """Contiguous stores in the CPU kernel's vectorized loops; the layout the GPU's sums
    read."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    pullback, _, _ = pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)
    pairs = [rows for rows in pullback.compiled.kernel.gradients if rows.pair]
    assert pairs and not any(rows.columns for rows in pairs)
    _, on_gpu = child_sum_tree_lstm.vjp(CHILD_SUM_FOREST, p, backend="cuda")
    assert all(rows.columns for rows in on_gpu.compiled.kernel.gradients if rows.pair)


@pytest.mark.parametrize("rows", [37, 200])
@pytest.mark.parametrize("a_width, b_width", [(128, 16), (96, 16), (16, 96), (128, 128)])
def test_a_weight_gradient_is_the_sum_of_its_outer_products_in_either_orientation(a_width,
                                                                                   b_width,
                                                                                   rows):
    """Σ_n a[n] ⊗ b[n], whichever side the product takes as its weight: the wider, or `b`
    where `a`'s rows (128 float64: 1 KiB) would make the gradient's C-ordered copy read at a
    stride that aliases in the cache, and then the product is the gradient as it lies; over
    fewer nodes than a walk's depth, and over several depths and a part of one
    (`runtime.PANEL_DEPTH`)."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    pullback, _, _ = pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)
    rng = np.random.default_rng(a_width + b_width)
    a_rows, b_rows = rng.normal(size=(rows, a_width)), rng.normal(size=(rows, b_width))
    gradient = pullback.compiled.weight_gradient(a_rows, b_rows)
    np.testing.assert_allclose(gradient, a_rows.T @ b_rows, rtol=1e-12, atol=1e-12)
    if a_width == 128:
        assert gradient.flags.c_contiguous


@pytest.mark.parametrize("rows, product", [
    (37, lambda workers, a, b, y: calls.weight_gradient(workers, a, b, y, 32)),
    (2 * calls.WEIGHT_GRADIENT_CHUNK + 300, calls.weight_gradient_by_chunks)],
    ids=["one product", "in chunks"])
def test_a_weight_gradient_does_not_depend_on_how_many_workers_share_it(rows, product):
    """The same sums, to the bit, from one worker or two: a process forked after a run
    computes on one thread, and `torch.autograd.gradcheck` asks a backward twice for one
    answer. a's 20 columns are two whole float64 panels and a padded one; b's 50 rows split
    into passes of six either way; over more than two chunks of rows (MV-RNN's W_M, a row
    per node and k), a partial a chunk, summed in order."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)  # exports the products
    rng = np.random.default_rng(5)
    a_rows, b_rows = rng.normal(size=(rows, 20)), rng.normal(size=(rows, 50))
    products = [np.empty((50, 20)) for _ in range(2)]
    for workers, y in zip((1, 2), products):
        product(workers, a_rows, b_rows, y)
    np.testing.assert_array_equal(products[0], products[1])
    np.testing.assert_allclose(products[0], b_rows.T @ a_rows, rtol=1e-12)


@pytest.mark.parametrize("b_width", [128, 96], ids=["rows 1 KiB apart", "rows 768 B apart"])
def test_a_weight_gradient_over_rows_in_few_cache_sets_reads_them_apart_with_the_same_sums(
        b_width):
    """b's rows 1 KiB apart (128 float64), over `APART_FROM_ROWS` nodes: the product reads a
    copy whose rows lie further apart, and gives the sums, to the bit, that it gives from the
    same rows lying apart already; rows 768 bytes apart are read where they lie."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)  # exports the products
    rows = calls.APART_FROM_ROWS
    rng = np.random.default_rng(b_width)
    a_rows, b_rows = rng.normal(size=(rows, 40)), rng.normal(size=(rows, b_width))
    apart = np.empty((rows, b_width + 8))
    apart[:, :b_width] = b_rows
    assert calls.rows_in_few_sets(b_rows) == (b_width == 128)
    assert not calls.rows_in_few_sets(apart[:, :b_width])
    products = [np.empty((b_width, 40)) for _ in range(2)]
    for b, product in zip((b_rows, apart[:, :b_width]), products):
        sum_of_outer_products(a_rows, b, product, 32)
    np.testing.assert_array_equal(products[0], products[1])
    np.testing.assert_allclose(products[0], b_rows.T @ a_rows, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("a_width, b_width", [(7, 5), (50, 40), (3, FLOAT32_PANEL)])
def test_per_tree_weight_gradients_are_each_trees_sum_of_outer_products(dtype, a_width,
                                                                         b_width):
    """Σ a[n] ⊗ b[n] over each tree's rows, whatever their order, with b's columns beyond
    its whole panels (5, 40), none beyond (a float32 panel), rows of a in several passes of
    six (50), and a tree without rows."""
    p = tree_lstm_params(HIDDEN, VOCAB, dtype, 1)
    pullback, _, _ = pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)
    rng = np.random.default_rng(a_width)
    owners = rng.permutation(np.repeat([0, 1, 3], [5, 13, 2]))  # tree 2 has none
    a_rows = rng.normal(size=(owners.size, a_width)).astype(dtype)
    b_rows = rng.normal(size=(owners.size, b_width)).astype(dtype)
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(5))
    totals = pullback.compiled.weight_gradients_by_tree(a_rows, b_rows, order, bounds)
    for tree in range(4):
        rows = owners == tree
        np.testing.assert_allclose(totals[tree], a_rows[rows].T @ b_rows[rows],
                                   rtol=1e-5, atol=1e-5)


def on_one_worker_and_two(call, shape, dtype):
    """`call(workers, total)` into a new `total` of `shape` with numba's thread count set to
    one worker, then to two (where numba has two): the two totals."""
    totals = [np.empty(shape, dtype) for _ in range(2)]
    before = numba.get_num_threads()
    try:
        for workers, total in zip((1, min(2, numba.config.NUMBA_NUM_THREADS)), totals):
            numba.set_num_threads(workers)
            call(workers, total)
    finally:
        numba.set_num_threads(before)
    return totals


def test_per_tree_weight_gradients_are_the_same_to_the_bit_on_any_worker_count():
    """The workers claim the trees as they come free; each tree's product is one worker's,
    in one order, whichever worker claims it."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float32", 1)
    pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)  # exports the products
    rng = np.random.default_rng(3)
    owners = rng.permutation(np.repeat(np.arange(6), [40, 3, 17, 0, 29, 8]))
    a_rows = rng.normal(size=(owners.size, 45)).astype("float32")
    b_rows = rng.normal(size=(owners.size, 37)).astype("float32")
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(7))
    totals = on_one_worker_and_two(lambda workers, total: calls.weight_gradients_by_tree(
        workers, a_rows, b_rows, order, bounds, total), (6, 45, 37), "float32")
    np.testing.assert_array_equal(totals[0], totals[1])
    np.testing.assert_array_equal(totals[0][3], 0)


@pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
def test_per_tree_row_sums_are_each_trees_sum_the_same_on_any_worker_count(columns):
    """A bias's per-tree gradient, Σ values[n] over each tree's rows whatever their order,
    from a kernel's rows as they lie or its columns read transposed, a tree without rows
    zero: the same to the bit from one worker or two, and NumPy's sums."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)  # exports the calls
    rng = np.random.default_rng(7)
    owners = rng.permutation(np.repeat([0, 1, 3], [5, 13, 2]))  # tree 2 has none
    values = rng.normal(size=(9, owners.size)).T if columns else rng.normal(size=(owners.size, 9))
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(5))
    totals = on_one_worker_and_two(lambda workers, total: calls.segment_sums(
        workers, values, order, bounds, total), (4, 9), "float64")
    np.testing.assert_array_equal(totals[0], totals[1])
    for tree in range(4):
        np.testing.assert_allclose(totals[0][tree], values[owners == tree].sum(axis=0),
                                   rtol=1e-12, atol=1e-12)


def test_a_weight_that_multiplies_both_children_gets_one_product_over_their_vectors():
    """Binary TreeLSTM's U_f multiplies each child's h: the kernel stores both children's
    vectors side by side in one row a node (a vector each), so that the host's one product
    over them all is U_f's gradient; the GPU's columns keep a pair a product."""
    forest = rj.Forest.from_nested([((0, 1), (2, (3, 4))), (1, 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    pullback, roots, nodes = pullback_and_cotangents(tree_lstm, forest, p, 1)

    def u_f_rows(kernel):
        return [(rows.side, rows.vectors, rows.size) for rows in kernel.gradients
                if rows.effect == "grad_param_outer" and rows.attrs == ("U_f",)]

    assert u_f_rows(pullback.compiled.kernel) == [(0, 2, 2 * HIDDEN), (1, 2, 2 * HIDDEN)]
    assert_same_gradients(pullback(roots=roots, nodes=nodes),
                          pullback.interpreted()(roots=roots, nodes=nodes))
    _, on_gpu = tree_lstm.vjp(forest, p, backend="cuda")
    assert u_f_rows(on_gpu.compiled.kernel) == [(0, 1, HIDDEN), (1, 1, HIDDEN)] * 2


def test_the_cpus_backward_kernel_sums_each_biass_rows_itself():
    """Every bias's rows (b_iou's of the internal nodes and of the leaves' groups, b_f's of
    the internal nodes) are summed at the kernel's end, for a whole gradient to read: each
    the sum of the rows the kernel filled."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    pullback, roots, nodes = pullback_and_cotangents(child_sum_tree_lstm, CHILD_SUM_FOREST, p, 1)
    kernel = pullback.compiled.kernel
    biases = [rows for rows in kernel.gradients if rows.effect == "grad_param"]
    sums = gradient_sums(kernel)
    assert sorted(total.a for total in sums) == sorted(rows.name for rows in biases)
    assert {total.parameter for total in sums} == {"b_iou", "b_f"}
    assert "sum_rows_share(" in pullback.compiled.source
    layout = pullback.layout(False)
    arrays = pullback.compiled(pullback.linearized, pullback.params, pullback.states,
                               pullback.incoming(roots, nodes), pullback.kept,
                               groups=layout.groups)
    for total in sums:
        np.testing.assert_allclose(arrays[total.total], arrays[total.a].sum(axis=0),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, columns", [("float64", 37), ("float32", 16), ("float32", 3)])
def test_a_biass_row_sums_are_the_same_to_the_bit_on_any_worker_count(dtype, columns):
    """Each worker sums whole cache lines of the columns (a part of one at the end, or none
    where there are fewer lines than workers), every column over the rows in order."""
    rows = np.random.default_rng(columns).normal(size=(29, columns)).astype(dtype)
    totals = []
    for workers in (1, 2, 3):
        total = np.full(columns, np.nan, dtype=dtype)
        for worker in range(workers):
            runtime.sum_rows_share(rows, total, worker, workers)
        totals.append(total)
    np.testing.assert_array_equal(totals[0], totals[1])
    np.testing.assert_array_equal(totals[0], totals[2])
    np.testing.assert_allclose(totals[0], rows.sum(axis=0), rtol=1e-5)


def test_transposed_weights_whose_rows_alias_in_the_cache_are_packed_and_still_right():
    """TreeRNN's W and U, 128 float64 (1 KiB) a row, read-only, read transposed by the
    backward over a forest of 64 nodes or more: packed into panels of its own first, the
    same gradients."""
    p = tree_rnn_params(128, VOCAB, "float64", 2)
    for value in vars(p).values():
        value.setflags(write=False)
    forest = rj.Forest.random_binary(4, seed=3, vocab_size=VOCAB)
    assert forest.num_nodes >= rj.Schedule().pack_from_nodes
    pullback, roots, nodes = pullback_and_cotangents(tree_rnn, forest, p, 5)
    assert "pack_rows_share(pT_W, room_pT_W" in tree_rnn.kernel_source("cpu", grad=True)
    assert_same_gradients(pullback(roots=roots, nodes=nodes),
                          pullback.interpreted()(roots=roots, nodes=nodes))


REPEATED_WORDS = rj.Forest.from_nested([((1, 2, 1), (2, (1, 0))), (0, 1, 2)])


def test_the_leaves_rows_are_summed_by_word_before_their_products():
    """Six leaves of three words: the leaf's products by the transposed weights, and the
    weights' gradients, take a row a word, and give the adjoint's gradients."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 4)
    pullback, roots, nodes = pullback_and_cotangents(child_sum_tree_lstm, REPEATED_WORDS, p, 4)
    kernel = pullback.compiled.kernel
    assert kernel.group_key == "word"
    grouped = {rows.name for rows in kernel.gradients if rows.rows is ilir.RowsOf.LEAF_GROUPS}
    assert grouped == {"group_grad_W_iou_45_a", "group_grad_W_iou_45_b", "group_grad_E_46"}
    products = [product for product in ilir.walk(kernel.body)
                if isinstance(product, ilir.MatMul) and product.weight == "pT_W_iou"]
    assert [(product.x, product.rows) for product in products] == [
        ("group_grad_W_iou_45_a", ilir.Var("num_leaf_groups"))]  # the sums, read in place
    got = pullback(roots=roots, nodes=nodes)
    expected = pullback.interpreted()(roots=roots, nodes=nodes)
    assert_same_gradients(got, expected)
    np.testing.assert_array_equal(got.params.E.indices, [0, 1, 2])


def test_per_tree_gradients_sum_the_leaves_of_one_tree_and_one_word():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 5)
    pullback, roots, nodes = pullback_and_cotangents(child_sum_tree_lstm, REPEATED_WORDS, p, 5)
    got = pullback(roots=roots, nodes=nodes, per_tree=True)
    expected = pullback.interpreted()(roots=roots, nodes=nodes, per_tree=True)
    assert_same_gradients(got, expected)
    assert [list(rows.indices) for rows in got.params.E] == [[0, 1, 2], [0, 1, 2]]


def test_leaf_groups_hold_the_leaves_of_one_word_and_per_tree_of_one_tree_and_word():
    """Leaves 4..9 (words 2 1 2 0 1 1) of trees 0 0 0 1 1 0."""
    forest = type("Linearized", (), {"leaf_begin": 4, "fields": {
        "word": np.array([-1, -1, -1, -1, 2, 1, 2, 0, 1, 1])}})
    kernel = ilir.Kernel("k", "float64", (), (), (), (), group_key="word")
    whole = leaf_groups(kernel, forest)
    assert [list(whole.leaves[a:b]) for a, b in zip(whole.ptr[:-1], whole.ptr[1:])] == [
        [3], [1, 4, 5], [0, 2]]
    assert list(whole.first_leaves()) == [3, 1, 0]
    trees = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 0])
    per_tree = leaf_groups(kernel, forest, trees)
    assert [list(per_tree.leaves[a:b]) for a, b in zip(per_tree.ptr[:-1], per_tree.ptr[1:])] == [
        [1, 5], [0, 2], [3], [4]]
    assert leaf_groups(ilir.Kernel("k", "float64", (), (), (), ()), forest) is None


@rj.recursive_model(arity=2)
def two_gated_leaves(node, p):
    """A leaf's effects read two of its values (each gate's), each summed by word."""
    if node.is_leaf:
        x = p.E[node.word]
        return rj.tanh(p.W @ x) + rj.sigmoid(p.V @ x)
    return rj.tanh(p.U @ (two_gated_leaves(node.left, p) + two_gated_leaves(node.right, p)))


@rj.recursive_model(arity=2)
def leaves_with_a_field(node, p):
    """A leaf reads a float field of its own, whose gradient is the leaf's alone."""
    if node.is_leaf:
        return rj.tanh(p.W @ p.E[node.word]) * node.x
    return rj.tanh(p.U @ (leaves_with_a_field(node.left, p)
                          + leaves_with_a_field(node.right, p)))


def gated_params(seed):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(VOCAB, 2)), W=rng.normal(size=(HIDDEN, 2)),
                     V=rng.normal(size=(HIDDEN, 2)), U=rng.normal(size=(HIDDEN, HIDDEN)) / 2)


def assert_compiled_gradients_are_the_adjoints(pullback, roots, nodes, per_tree=False):
    assert_same_gradients(pullback(roots=roots, nodes=nodes, per_tree=per_tree),
                          pullback.interpreted()(roots=roots, nodes=nodes, per_tree=per_tree))


@pytest.mark.parametrize("per_tree", [False, True], ids=["whole", "per tree"])
def test_leaves_whose_effects_read_two_of_their_values_sum_each_by_word(per_tree):
    forest = rj.Forest.random_binary(2, seed=3, mean_leaves=6, vocab_size=VOCAB)
    pullback, roots, nodes = pullback_and_cotangents(two_gated_leaves, forest,
                                                     gated_params(6), 6)
    kernel = pullback.compiled.kernel
    assert kernel.group_key == "word"
    summed = [array for array in kernel.arrays if array.startswith("group_")]
    assert any(array.startswith("group_grad_W") for array in summed)
    assert any(array.startswith("group_grad_V") for array in summed)
    assert_compiled_gradients_are_the_adjoints(pullback, roots, nodes, per_tree)


def test_leaves_that_read_a_float_field_of_their_own_are_not_summed_by_word():
    forest = rj.Forest.random_binary(2, seed=4, mean_leaves=6, vocab_size=VOCAB)
    forest.fields["x"] = np.random.default_rng(7).normal(size=(forest.num_nodes, HIDDEN))
    pullback, roots, nodes = pullback_and_cotangents(leaves_with_a_field, forest,
                                                     gated_params(7), 7)
    assert pullback.compiled.kernel.group_key is None
    assert_compiled_gradients_are_the_adjoints(pullback, roots, nodes)


def test_rows_per_node_are_refused_where_the_backward_summed_them_by_word():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 4)
    pullback, roots, nodes = pullback_and_cotangents(child_sum_tree_lstm, REPEATED_WORDS, p, 4)
    sink = pullback.backward(roots=roots, nodes=nodes)
    with pytest.raises(rj.RecJitError, match="model.jacobian"):
        sink.gathered_by_node("E", (HIDDEN,))


def test_explain_with_grad_says_the_leaves_rows_are_summed_by_word():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 4)
    text = child_sum_tree_lstm.explain(REPEATED_WORDS, p, grad=True)
    backward = text[text.index("== backward ILIR (cpu) =="):]
    assert ("group_grad_W_iou_45_a[slot, e] = (group_grad_W_iou_45_a[slot, e] + "
            "leaf_v41[leaf, e])") in backward
    assert "the leaves' rows are summed by `word`" in backward
