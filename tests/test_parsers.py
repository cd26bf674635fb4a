"""Trees from a parser: `Forest.from_nltk` reads nltk.Trees with string labels, words and
labels kept in vocabularies, unary chains collapsed and nodes binarized on request, and the
zoo's models run on them as on any forest."""
import pytest

import recjit as rj
from tree_lstm import child_sum_tree_lstm, make_params, tree_lstm

from conftest import assert_same_result

nltk = pytest.importorskip("nltk")
PARSED = "(S (NP (DT the) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"


def test_a_parsed_trees_words_labels_and_children_follow_it():
    forest = rj.Forest.from_nltk(nltk.Tree.fromstring(PARSED))
    words = {word: index for index, word in enumerate(["the", "cat", "sat", "on", "mat", "."])}
    assert forest.vocab == words
    assert forest.roots.tolist() == [0]
    names = {index: label for label, index in forest.label_vocab.items()}
    assert [names[label] for label in forest.fields["label"][:3].tolist()] == \
        ["S", "NP", "DT"]
    leaves = forest.fields["word"] >= 0
    assert leaves.sum() == 7  # the preterminals are the leaves
    assert forest.num_children[0] == 3


def test_unary_chains_collapse_and_nodes_binarize_with_nltks_transformations():
    chain = nltk.Tree.fromstring("(ROOT (S (VP (VB go) (RB now))))")
    collapsed = rj.Forest.from_nltk(chain, collapse_unary=True)
    assert collapsed.num_nodes == 3 and "ROOT+S+VP" in collapsed.label_vocab
    binarized = rj.Forest.from_nltk(nltk.Tree.fromstring(PARSED), binarize=True)
    assert binarized.num_children.max() == 2
    assert nltk.Tree.fromstring(PARSED) == nltk.Tree.fromstring(PARSED)  # inputs untouched


def test_labels_that_are_not_strings_collapse_as_the_strings_the_forest_keeps():
    chain = nltk.Tree(None, [nltk.Tree(3, [nltk.Tree("NN", ["go"]), nltk.Tree("RB", ["now"])])])
    collapsed = rj.Forest.from_nltk(chain, collapse_unary=True)
    assert "None+3" in collapsed.label_vocab
    assert rj.Forest.from_nltk(chain).label_vocab.keys() >= {"None", "3"}


@pytest.mark.parametrize("transformation", ["collapse_unary", "binarize"])
def test_a_tree_too_deep_for_nltks_transformations_is_refused_naming_them(transformation):
    """nltk's transformations recurse; reading the same tree as it is does not."""
    chain = nltk.Tree("X", ["w"])
    for _ in range(3000):
        chain = nltk.Tree("X", [chain, nltk.Tree("Y", ["v"])])
    assert rj.Forest.from_nltk(chain).num_nodes == 6001
    with pytest.raises(rj.InputError, match=f"tree #0 is too deep for {transformation}"):
        rj.Forest.from_nltk(chain, **{transformation: True})


def test_models_run_on_parsed_trees_as_the_recursion_does():
    trees = [nltk.Tree.fromstring(PARSED), nltk.Tree.fromstring("(S (NP (PRP it)) (VP (VBZ is)))")]
    vocab = {}
    any_arity = rj.Forest.from_nltk(trees, vocab=vocab)
    binary = rj.Forest.from_nltk(trees, vocab=vocab, collapse_unary=True, binarize=True)
    p = make_params(4, len(vocab), "float64", 0)
    assert_same_result(child_sum_tree_lstm.run(any_arity, p),
                       child_sum_tree_lstm.reference(any_arity, p))
    assert_same_result(tree_lstm.run(binary, p), tree_lstm.reference(binary, p))


def test_something_other_than_an_nltk_tree_is_refused_naming_it():
    with pytest.raises(rj.InputError, match="tree #1 is a str, not an nltk.Tree"):
        rj.Forest.from_nltk([nltk.Tree.fromstring(PARSED), "(S (NN x))"])


def test_a_subtree_that_is_neither_a_tree_nor_a_word_is_refused_naming_its_parent():
    with pytest.raises(rj.InputError, match=r"node \(NP\) has a child 5 \(int\), neither"):
        rj.Forest.from_nltk(nltk.Tree("S", [nltk.Tree("NP", [nltk.Tree("NN", ["cat"]), 5])]))


@pytest.mark.parametrize("argument, message", [
    ({"vocab": ["cat"]}, "vocab must be a dict of a word to its id"),
    ({"labels": 5}, "labels must be a dict of a label to its id"),
    ({"labels": {"S": -1}}, "labels must be a dict of a label to its id"),
], ids=["vocab a list", "labels a number", "a negative label id"])
def test_a_vocabulary_that_is_not_a_dict_of_ids_is_refused_naming_it(argument, message):
    with pytest.raises(rj.InputError, match=message):
        rj.Forest.from_nltk(nltk.Tree.fromstring(PARSED), **argument)
    with pytest.raises(rj.InputError, match=message):
        rj.Forest.from_ptb(["(S (NN cat))"], **argument)


def test_words_new_to_a_vocabulary_take_the_ids_after_its_largest():
    vocab = {"the": 7, "cat": 2}
    forest = rj.Forest.from_nltk(nltk.Tree.fromstring(PARSED), vocab=vocab)
    assert vocab == {"the": 7, "cat": 2, "sat": 8, "on": 9, "mat": 10, ".": 11}
    assert forest.vocab is vocab
