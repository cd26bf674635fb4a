"""Forest constructors."""
import networkx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import recjit as rj
from tree_lstm import make_params, tree_lstm


def test_from_nested_numbers_nodes_in_preorder_with_words_on_leaves():
    forest = rj.Forest.from_nested([((3, 4), 5), 6])
    assert forest.num_nodes == 6
    assert forest.roots.tolist() == [0, 5]
    assert forest.children(0).tolist() == [1, 4]
    assert forest.children(1).tolist() == [2, 3]
    assert forest.fields["word"].tolist() == [-1, -1, 3, 4, 5, 6]


def test_from_ptb_reads_labels_words_and_builds_a_vocabulary():
    lines = ["(3 (2 It) (4 (2 's) (4 great)))\n", "\n", "(1 (0 8 1\\/2) (2 It))\n"]
    forest = rj.Forest.from_ptb(lines)
    assert forest.roots.size == 2
    assert forest.labels.tolist() == [3, 2, 4, 2, 4, 1, 0, 2]
    assert forest.vocab == {"It": 0, "'s": 1, "great": 2, "8 1\\/2": 3}
    assert forest.fields["word"].tolist() == [-1, 0, -1, 1, 2, -1, 3, 0]


def test_from_ptb_extends_a_given_vocabulary():
    vocab = {"It": 7}
    forest = rj.Forest.from_ptb(["(1 (2 It) (3 new))"], vocab=vocab)
    assert forest.fields["word"].tolist() == [-1, 7, 8]


LINES = ["(3 (2 It) (4 (2 's) (4 great)))", "(1 (0 8 1\\/2) (2 It))", "(2 (2 It) (1 sank))"]


def test_a_corpus_read_a_tree_a_call_through_one_vocabulary_is_the_corpus_read_at_once():
    vocab = {}
    trees = rj.Forest.concat([rj.Forest.from_ptb([line], vocab=vocab) for line in LINES])
    at_once = rj.Forest.from_ptb(LINES)
    assert vocab == at_once.vocab
    assert trees.fields["word"].tolist() == at_once.fields["word"].tolist()


class CountedVocabulary(dict):
    """A vocabulary that counts how often its ids are read all at once."""

    scans = 0

    def values(self):
        self.scans += 1
        return super().values()


def test_a_vocabulary_a_reader_left_as_it_was_is_not_scanned_again():
    """Reading a corpus a tree a call stays linear in the corpus: neither the check of every
    id nor the search for the largest runs again for a dict the last reader extended."""
    vocab = CountedVocabulary()
    rj.Forest.from_ptb(LINES[:1], vocab=vocab)
    scans = vocab.scans
    for line in LINES[1:]:
        rj.Forest.from_ptb([line], vocab=vocab)
    assert vocab.scans == scans
    assert sorted(vocab.values()) == list(range(len(vocab)))


def test_a_word_the_caller_swaps_for_another_between_reads_is_seen_and_ids_stay_distinct():
    """The same length, another last word: the reader scans the vocabulary again."""
    vocab = {}
    rj.Forest.from_ptb(LINES[:1], vocab=vocab)
    del vocab["great"]
    vocab["swapped"] = max(vocab.values()) + 2
    rj.Forest.from_ptb(["(1 (2 fresh) (3 new))"], vocab=vocab)
    assert len(set(vocab.values())) == len(vocab)


def test_a_word_the_caller_adds_between_reads_keeps_its_id_and_the_next_new_word_follows_it():
    vocab = {}
    rj.Forest.from_ptb(LINES[:1], vocab=vocab)
    vocab["added"] = 50
    forest = rj.Forest.from_ptb(["(1 (2 added) (3 unseen))"], vocab=vocab)
    assert forest.fields["word"].tolist() == [-1, 50, 51]


def test_from_ptb_reads_the_whole_text_or_lines_in_bytes_as_it_reads_lines():
    """Windows' line ends and the byte-order mark its editors put first included."""
    lines = ["(3 (2 It) (4 (2 's) (4 great)))", "(1 (0 8 1\\/2) (2 It))"]
    expected = rj.Forest.from_ptb(lines)
    for text in ("\n".join(lines) + "\n", [line.encode() for line in lines],
                 "\n".join(lines).encode(), "\ufeff" + "\r\n".join(lines) + "\r\n",
                 ("\ufeff" + "\r\n".join(lines)).encode()):
        forest = rj.Forest.from_ptb(text)
        assert forest.labels.tolist() == expected.labels.tolist()
        assert forest.fields["word"].tolist() == expected.fields["word"].tolist()
        assert forest.vocab == expected.vocab


def test_from_ptb_reads_a_file_given_as_a_path_and_refuses_a_path_given_as_text(tmp_path):
    lines = ["(3 (2 It) (4 (2 's) (4 great)))", "(1 (0 8 1\\/2) (2 It))"]
    path = tmp_path / "trees.txt"
    path.write_text("\ufeff" + "\r\n".join(lines) + "\r\n", encoding="utf-8")
    forest, expected = rj.Forest.from_ptb(path), rj.Forest.from_ptb(lines)
    assert forest.labels.tolist() == expected.labels.tolist()
    assert forest.vocab == expected.vocab
    with pytest.raises(rj.InputError, match=r"is the path of a file, not PTB text: pass "
                                            r"pathlib.Path\(path\) or open\(path\)"):
        rj.Forest.from_ptb(str(path))
    with pytest.raises(rj.InputError, match=r"cannot read '.*missing.txt' \(No such file"):
        rj.Forest.from_ptb(tmp_path / "missing.txt")


@pytest.mark.parametrize("line, message", [
    ("(3 (2 a) (2 b)", "unbalanced"), ("(3 (2 a)) )", "unbalanced"),
    ("(x (2 a) (2 b))", "expected a label"), ("(2 a) (2 b)", "more than one tree"),
    ("(\u00b2 a)", "expected a label"), ("(99999999999999999999999 a)", "expected a label"),
    (b"(1 \xff)", "PTB line 1 is not UTF-8"), (7, "PTB line 1 is a int, not text"),
    ("(3 a (2 b))", "follows a word"), ("(3 (2 ) (3 b))", "neither a word nor subtrees"),
], ids=["unclosed", "closed twice", "a word as label", "two trees", "a superscript digit",
        "a label past int64", "bytes not UTF-8", "not text", "a word and a subtree",
        "a label alone"])
def test_from_ptb_refuses_malformed_lines_naming_the_line(line, message):
    with pytest.raises(rj.InputError, match=message) as error:
        rj.Forest.from_ptb([line])
    assert str(error.value).startswith("PTB line 1")


def test_from_edges_keeps_edge_order_and_finds_roots():
    forest = rj.Forest.from_edges(4, [(0, 2), (0, 1), (1, 3)], fields={"x": np.ones((4, 2))})
    assert forest.children(0).tolist() == [2, 1]
    assert forest.roots.tolist() == [0]
    assert forest.kind == "dag"


@pytest.mark.parametrize("num_nodes, edges, message", [
    (-1, [], r"num_nodes must be an int >= 0, not -1"),
    (2.5, [(0, 1)], r"num_nodes must be an int >= 0, not 2.5"),
    (3, [(0, 1, 2)], r"\(parent, child\) pairs, an array of shape \(E, 2\), not \(1, 3\)"),
    (3, [(0, 1.5)], r"integer node indices, not float64"),
], ids=["negative count", "fractional count", "triples", "fractional index"])
def test_from_edges_refuses_what_is_not_a_count_and_pairs_of_nodes(num_nodes, edges, message):
    with pytest.raises(rj.InputError, match=message):
        rj.Forest.from_edges(num_nodes, edges)


@pytest.mark.parametrize("make, message", [
    (lambda: rj.Forest.random_binary(-1), "num_trees must be an int >= 0, not -1"),
    (lambda: rj.Forest.random_binary(2.5), "num_trees must be an int >= 0, not 2.5"),
    (lambda: rj.Forest.random_binary(2, vocab_size=0), "vocab_size must be an int >= 1, not 0"),
    (lambda: rj.Forest.perfect(2, num_trees=-1), "num_trees must be an int >= 0, not -1"),
    (lambda: rj.Forest.perfect(2.5), "height must be an int >= 0, not 2.5"),
    (lambda: rj.Forest.from_sequences([2.5]), "sequence lengths must be integers, not float64"),
    (lambda: rj.Forest.from_sequences([[1, 2]]), r"not an array of shape \(1, 2\)"),
    (lambda: rj.Forest.from_sequences([[1, 2, 3], [4, 5]]),
     r"not of sequences; from_sequences takes the sequences' lengths, their steps' values"),
    (lambda: rj.Forest.from_sequences([3, 0]), "sequence 1 has length 0"),
    (lambda: rj.Forest.random_binary(2, mean_leaves=-1), "mean_leaves must be a number from 0"),
    (lambda: rj.Forest.random_binary(2, mean_leaves=float("nan")), "mean_leaves must be a"),
    (lambda: rj.Forest.random_binary(2, seed="x"), "seed must be an int"),
    (lambda: rj.Forest.perfect(80), "height 80 would have 2\\*\\*81 - 1 nodes"),
    (lambda: rj.Forest.perfect(40, num_trees=2**30), "would have .* nodes, more than"),
    (lambda: rj.Forest.from_nested([(2**70, 1)]), "leaf 1180591620717411303424 is outside"),
    (lambda: rj.Forest.from_nested([(np.uint64(2**63), 1)]), "leaf 9223372036854775808 is"),
    (lambda: rj.Forest.from_nested(5), "Forest.from_nested: trees must be an iterable"),
    (lambda: rj.Forest.from_nested([1], leaf_field=3), "leaf_field must name a field"),
    (lambda: rj.Forest.from_ptb(["(1 a)"], vocab=["a"]), "vocab must be a dict"),
    (lambda: rj.Forest.from_ptb(3), "Forest.from_ptb: lines must be an iterable"),
    (lambda: rj.Forest([0], [], [], fields=[1]), "fields must be a dict"),
], ids=["negative trees", "fractional trees", "empty vocabulary", "negative perfect trees",
        "fractional height", "fractional length", "lengths of two dimensions",
        "the sequences, not lengths", "a length 0", "negative mean leaves", "NaN mean leaves",
        "a seed of text", "too high a tree", "too many trees", "a leaf past int64",
        "a leaf past int64 unsigned", "not nested", "a field name not a name",
        "a vocabulary not a dict", "not lines", "fields not a dict"])
def test_the_constructors_refuse_what_they_cannot_build_naming_the_argument(make, message):
    with pytest.raises(rj.InputError, match=message):
        make()


def test_from_sequences_of_no_sequences_is_an_empty_forest_as_from_nested_of_no_trees():
    for forest in (rj.Forest.from_sequences([]), rj.Forest.from_nested([])):
        assert forest.num_nodes == 0 and forest.roots.size == 0


@pytest.mark.parametrize("dtype", [">i8", ">i4", ">f8", "<i8"])
def test_a_field_in_another_byte_order_holds_its_numbers_in_the_machines(dtype):
    forest = rj.Forest.from_nested([(0, 1)], leaf_field="x")
    forest = rj.Forest(forest.child_ptr, forest.child_idx, forest.roots,
                       {"x": np.array([5, 0, 1], dtype=dtype)})
    assert forest.fields["x"].dtype.isnative
    assert forest.fields["x"].tolist() == [5, 0, 1]


def test_roots_of_more_than_one_dimension_are_refused():
    with pytest.raises(rj.InputError, match=r"roots must be a 1-d array, not one of shape "
                                            r"\(1, 1\)"):
        rj.Forest([0, 2, 2, 2], [1, 2], [[0]], {"word": [0, 1, 2]})


def test_a_field_of_the_wrong_length_is_refused():
    with pytest.raises(rj.InputError, match="field 'x' has shape"):
        rj.Forest.from_edges(3, [(0, 1)], fields={"x": np.ones(2)})


def test_perfect_trees_have_every_leaf_at_the_given_height():
    forest = rj.Forest.perfect(3, num_trees=2, vocab_size=7)
    assert forest.num_nodes == 2 * 15 and forest.roots.tolist() == [0, 15]
    assert forest.children(15).tolist() == [16, 17]
    linearized = rj.linearize.linearize(forest)
    assert np.diff(linearized.batch_begin).tolist() == [2, 4, 8, 16]
    words = forest.fields["word"]
    assert (words[forest.num_children == 0] >= 0).all() and (words < 7).all()
    assert (words[forest.num_children > 0] == -1).all()


def test_a_grid_dag_cell_reads_its_left_and_upper_neighbours():
    forest = rj.Forest.grid_dag(3, 4, num_grids=2)
    assert forest.kind == "dag" and forest.roots.tolist() == [11, 23]
    assert forest.children(0).tolist() == []
    assert forest.children(2).tolist() == [1]
    assert forest.children(4).tolist() == [0]
    assert forest.children(5).tolist() == [4, 1]
    assert forest.children(12 + 5).tolist() == [12 + 4, 12 + 1]
    assert rj.linearize.linearize(forest, single_parent=False).num_batches == 3 + 4 - 1


def test_sequences_chain_each_step_to_the_previous_one():
    forest = rj.Forest.from_sequences([3, 1, 2], fields={"word": [5, 6, 7, 8, 9, 10]})
    assert forest.kind == "sequence"
    assert forest.roots.tolist() == [2, 3, 5]
    assert [forest.children(n).tolist() for n in range(6)] == [[], [0], [1], [], [], [4]]
    with pytest.raises(rj.InputError, match="sequence 1 has length 0"):
        rj.Forest.from_sequences([2, 0])


def test_from_networkx_makes_an_edge_u_to_v_a_child_u_of_v():
    graph = networkx.DiGraph()
    graph.add_nodes_from([("a", {"x": [1.0]}), ("b", {"x": [2.0]}), ("c", {"x": [3.0]}),
                          ("d", {"x": [4.0]})])
    graph.add_edges_from([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    forest = rj.Forest.from_networkx(graph, fields=["x"])
    assert forest.kind == "dag" and forest.node_keys == ["a", "b", "c", "d"]
    assert forest.roots.tolist() == [3]
    assert forest.children(3).tolist() == [1, 2] and forest.children(1).tolist() == [0]
    assert forest.fields["x"][:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    tree = rj.Forest.from_networkx(networkx.DiGraph([("a", "b"), ("c", "b")]))
    assert tree.kind == "tree"
    with pytest.raises(rj.InputError, match="no attribute 'x'"):
        rj.Forest.from_networkx(networkx.DiGraph([("a", "b")]), fields=["x"])


def test_from_networkx_orders_a_nodes_children_as_their_edges_to_it_were_added():
    """Not by the order of the nodes: an N-ary cell's left child is the first edge's."""
    graph = networkx.DiGraph()
    graph.add_nodes_from(["root", "right", "left"])
    graph.add_edges_from([("left", "root"), ("right", "root")])
    forest = rj.Forest.from_networkx(graph)
    assert [forest.node_keys[child] for child in forest.children(forest.roots[0])] == \
        ["left", "right"]


def test_from_networkx_takes_one_field_name_as_a_string():
    graph = networkx.DiGraph([("a", "b")])
    networkx.set_node_attributes(graph, {"a": 4, "b": -1}, "word")
    assert rj.Forest.from_networkx(graph, fields="word").fields["word"].tolist() == [4, -1]


@pytest.mark.parametrize("graph", [networkx.Graph([(1, 2)]), networkx.MultiDiGraph([(1, 2)]),
                                   [(1, 2)]], ids=["undirected", "multigraph", "a list"])
def test_from_networkx_refuses_what_is_not_a_digraph_naming_its_type(graph):
    with pytest.raises(rj.InputError, match="takes a networkx DiGraph"):
        rj.Forest.from_networkx(graph)


def test_from_networkx_refuses_an_attribute_of_different_shapes_naming_it():
    graph = networkx.DiGraph([("a", "b")])
    networkx.set_node_attributes(graph, {"a": [1.0, 2.0], "b": [1.0]}, "x")
    with pytest.raises(rj.InputError, match=r"attribute 'x' has shapes \[\(1,\), \(2,\)\]"):
        rj.Forest.from_networkx(graph, fields=["x"])


PTB_LINES = ["(3 (2 It) (4 (2 's) (4 great)))", "(1 (0 dull) (2 It))", "(2 fine)",
             "(4 (3 (2 a) (2 good)) (3 film))"]


def assert_same_forest(got, expected):
    for name in ("child_ptr", "child_idx", "roots"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))
    assert sorted(got.fields) == sorted(expected.fields)
    for name, values in expected.fields.items():
        np.testing.assert_array_equal(got.fields[name], values)
    assert got.kind == expected.kind


@pytest.mark.parametrize("trees", [[1, 3], slice(1, 3), np.array([False, True, True, False]), 2],
                         ids=["indices", "slice", "mask", "int"])
def test_select_gives_the_chosen_trees_as_reading_them_alone_would(trees):
    whole = rj.Forest.from_ptb(PTB_LINES)
    chosen = np.arange(len(PTB_LINES))[trees]
    alone = rj.Forest.from_ptb([PTB_LINES[i] for i in np.atleast_1d(chosen)],
                               vocab=dict(whole.vocab))
    selected = whole.select(trees)
    assert_same_forest(selected, alone)
    assert selected.vocab is whole.vocab


@given(st.integers(1, 30), st.integers(1, 7), st.integers(0, 2**16))
def test_concat_of_a_forest_cut_into_batches_is_the_forest(num_trees, batch, seed):
    whole = rj.Forest.random_binary(num_trees, seed=seed)
    batches = [whole.select(slice(begin, begin + batch)) for begin in range(0, num_trees, batch)]
    assert_same_forest(rj.Forest.concat(batches), whole)


def test_select_keeps_a_node_that_two_chosen_roots_share_once():
    dag = rj.Forest.from_edges(5, [(0, 2), (0, 3), (1, 3), (1, 4)],
                               fields={"x": np.arange(10.0).reshape(5, 2)})
    both, second = dag.select([0, 1]), dag.select([1])
    assert_same_forest(both, dag)
    assert second.num_nodes == 3 and second.roots.tolist() == [0]
    assert second.children(0).tolist() == [1, 2]
    np.testing.assert_array_equal(second.fields["x"], dag.fields["x"][[1, 3, 4]])


def test_select_refuses_what_does_not_index_the_roots():
    with pytest.raises(rj.InputError, match=r"Forest.select: 4 does not index the forest's 4 "
                                            r"roots"):
        rj.Forest.from_ptb(PTB_LINES).select(4)


def test_select_refuses_children_that_are_not_nodes():
    forest = rj.Forest([0, 2, 2, 2], [1, 7], [0], fields={"word": [-1, 0, 1]})
    with pytest.raises(rj.InputError, match=r"node 0 has a child outside 0..2"):
        forest.select([0])


def test_concat_refuses_a_child_outside_its_own_forest_naming_the_forest_and_node():
    """Node 0's child 5 lies past its own forest's three nodes; once the forests are joined
    it would be a node of the next forest, a structure no forest had."""
    good = rj.Forest([0, 2, 2, 2], [1, 2], [0], fields={"word": [-1, 0, 1]})
    bad = rj.Forest([0, 2, 2, 2], [1, 5], [0], fields={"word": [-1, 0, 1]})
    with pytest.raises(rj.InputError, match=r"Forest.concat: forest 1: node 0 has a child "
                                            r"outside 0..2"):
        rj.Forest.concat([good, bad, good])


def test_concat_refuses_forests_whose_word_ids_mean_other_words():
    first, second = rj.Forest.from_ptb(PTB_LINES[:1]), rj.Forest.from_ptb(PTB_LINES[1:2])
    with pytest.raises(rj.InputError, match="forest 1 has another vocabulary than forest 0"):
        rj.Forest.concat([first, second])


def test_concat_refuses_a_field_of_other_widths_or_kinds_naming_it():
    def forest(values):
        return rj.Forest.from_edges(2, [(0, 1)], fields={"x": values})

    with pytest.raises(rj.InputError, match=r"field 'x' of forest 1 holds float64 rows of shape "
                                            r"\(3,\), forest 0's float64 rows of shape \(2,\)"):
        rj.Forest.concat([forest(np.ones((2, 2))), forest(np.ones((2, 3)))])
    with pytest.raises(rj.InputError, match="field 'x' of forest 1 holds float64 rows"):
        rj.Forest.concat([forest(np.ones(2, dtype=int)), forest(np.ones(2))])


def test_concat_refuses_forests_of_other_fields_or_kinds():
    trees = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.InputError, match=r"forest 1 has fields \['label', 'word'\], forest "
                                            r"0 \['word'\]"):
        rj.Forest.concat([trees, rj.Forest.from_ptb(PTB_LINES)])
    with pytest.raises(rj.InputError, match="forest 1 is of kind 'sequence', forest 0 of kind "
                                            "'tree'"):
        rj.Forest.concat([trees, rj.Forest.from_sequences([2], fields={"word": [1, 2]})])


def test_batches_cover_every_tree_once_in_order_or_shuffled_by_seed():
    forest = rj.Forest.random_binary(10, seed=0, mean_leaves=4, vocab_size=10)
    heights = forest.root_heights()
    in_order = list(forest.batches(4))
    assert [batch.roots.size for batch in in_order] == [4, 4, 2]
    assert np.concatenate([b.root_heights() for b in in_order]).tolist() == heights.tolist()
    first, again = (list(forest.batches(3, shuffle=True, seed=5)) for _ in range(2))
    assert [b.num_nodes for b in first] == [b.num_nodes for b in again]
    assert sorted(np.concatenate([b.root_heights() for b in first]).tolist()) == \
        sorted(heights.tolist())


def test_batches_have_a_length_for_a_progress_bars_total():
    forest = rj.Forest.random_binary(10, seed=0, mean_leaves=4, vocab_size=10)
    batches = forest.batches(4, bucket_by_height=True)
    assert len(batches) == 3 and len(list(batches)) == 3


def test_batches_bucketed_by_height_hold_trees_of_about_one_height():
    forest = rj.Forest.random_binary(12, seed=1, mean_leaves=6, vocab_size=10)
    batches = list(forest.batches(4, shuffle=True, seed=2, bucket_by_height=True))
    ranges = sorted((b.root_heights().min(), b.root_heights().max()) for b in batches)
    assert all(high <= low_next for (_, high), (low_next, _) in zip(ranges, ranges[1:]))


def test_batches_with_their_indices_put_what_they_compute_back_in_the_corpus_order():
    forest = rj.Forest.random_binary(11, seed=3, mean_leaves=5, vocab_size=10)
    p = make_params(4, 10, "float64", 0)
    states = np.full((forest.roots.size, 4), np.nan)
    for positions, batch in forest.batches(3, shuffle=True, seed=4, bucket_by_height=True,
                                           indices=True):
        states[positions] = tree_lstm.run(batch, p).roots[0]
    np.testing.assert_allclose(states, tree_lstm.run(forest, p).roots[0], rtol=1e-12)


def test_a_pass_in_batches_checks_the_forests_structure_once_at_the_call(monkeypatch):
    """Not once a batch: each check reads the whole corpus, and a pass over SST train in
    batches of 25 spent most of its time checking."""
    from recjit.linearize import forest as forest_module
    forest = rj.Forest.random_binary(12, seed=1, mean_leaves=4, vocab_size=10)
    checks = []
    monkeypatch.setattr(forest_module, "check_structure", lambda f: checks.append(f))
    batches = forest.batches(3)
    assert len(checks) == 1
    assert len(list(batches)) == 4 and len(checks) == 1


def test_a_forest_whose_structure_is_wrong_is_refused_when_batches_are_asked_for():
    broken = rj.Forest([0, 2, 2, 2], [1, 7], [0], fields={"word": [-1, 0, 1]})
    with pytest.raises(rj.InputError, match="node 0 has a child outside 0..2"):
        broken.batches(1)


def test_a_root_heights_are_their_trees_heights():
    forest = rj.Forest.from_nested([(0, 1), 2, ((0, 1), (2, (3, 4)))])
    assert forest.root_heights().tolist() == [1, 0, 3]


@pytest.mark.parametrize("size", [0, 2.5, True])
def test_a_batch_size_that_is_not_a_count_of_trees_is_refused(size):
    with pytest.raises(rj.InputError, match="size must be a whole number of trees"):
        rj.Forest.from_nested([(0, 1)]).batches(size)



@pytest.mark.parametrize("seed", ["x", 1.5, -1])
def test_a_batches_seed_numpy_does_not_take_is_refused_naming_it(seed):
    with pytest.raises(rj.InputError, match="seed must be an int"):
        rj.Forest.from_nested([(0, 1), 2]).batches(1, shuffle=True, seed=seed)

TREEBANK = """( (S
    (NP-SBJ (NNP Pierre) (NNP Vinken) )
    (VP (MD will)
      (VP (VB join) (NP (DT the) (NN board) )))
    (. .) ))
( (S (NP-SBJ (PRP It)) (VP (VBZ works)) (. .)) )
"""


def test_from_ptb_reads_a_treebanks_trees_over_lines_with_string_labels():
    labels = {}
    forest = rj.Forest.from_ptb(TREEBANK, labels=labels)
    assert forest.roots.size == 2 and forest.label_vocab is labels
    names = {index: label for label, index in labels.items()}
    assert [names[int(forest.fields["label"][root])] for root in forest.roots] == ["S", "S"]
    assert sorted(forest.vocab) == sorted(["Pierre", "Vinken", "will", "join", "the", "board",
                                           ".", "It", "works"])
    assert forest.num_children[forest.roots[0]] == 3  # the outer bracket makes no node


def test_from_ptb_asks_for_labels_when_a_label_is_a_string():
    with pytest.raises(rj.InputError, match=r"string labels are read with labels=\{\}"):
        rj.Forest.from_ptb(TREEBANK)


def test_a_treebank_tree_never_closed_names_the_line_it_opened_on():
    with pytest.raises(rj.InputError, match="PTB line 2: unbalanced brackets"):
        rj.Forest.from_ptb(["(S (NN a))", "( (S (NP (NN b))", "(VP (VB c))"], labels={})
