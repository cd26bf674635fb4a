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
