"""Forest constructors."""
import numpy as np
import pytest

import recjit as rj


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


@pytest.mark.parametrize("line, message", [
    ("(3 (2 a) (2 b)", "unbalanced"), ("(3 (2 a)) )", "unbalanced"),
    ("(x (2 a) (2 b))", "expected a label"), ("(2 a) (2 b)", "more than one tree"),
])
def test_from_ptb_refuses_malformed_lines_naming_the_line(line, message):
    with pytest.raises(rj.InputError, match=f"PTB line 1: {message}"):
        rj.Forest.from_ptb([line])


def test_from_edges_keeps_edge_order_and_finds_roots():
    forest = rj.Forest.from_edges(4, [(0, 2), (0, 1), (1, 3)], fields={"x": np.ones((4, 2))})
    assert forest.children(0).tolist() == [2, 1]
    assert forest.roots.tolist() == [0]
    assert forest.kind == "dag"


def test_a_field_of_the_wrong_length_is_refused():
    with pytest.raises(rj.InputError, match="field 'x' has shape"):
        rj.Forest.from_edges(3, [(0, 1)], fields={"x": np.ones(2)})
