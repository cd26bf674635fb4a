"""The examples' command lines: they refuse what they cannot run, naming the argument, before
anything compiles, and the treebank's states come out in the file's order."""
import os
import subprocess
import sys

import numpy as np
import pytest

import recjit as rj

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "examples"))


@pytest.mark.parametrize("arguments, message", [
    (["tree_rnn.py", "--batch", "0"], "argument --batch: must be at least 1, not 0"),
    (["tree_rnn.py", "--hidden", "-3"], "argument --hidden: must be at least 1, not -3"),
    (["tree_rnn.py", "--trees", "no-such-file.txt"], "argument --trees: no file"),
    (["train_sst.py", "--epochs", "0"], "argument --epochs: must be at least 1, not 0"),
    (["tree_rnn.py", "--trees", "{empty}"], "no trees in it"),
    (["gru.py", "--trees", "{empty}"], "no trees in it"),
    (["tree_rnn.py", "--trees", "{unbalanced}"], "PTB line 2: unbalanced brackets"),
], ids=["no trees", "a negative hidden size", "a missing file", "no epochs",
        "an empty file of trees", "an empty file of sentences", "a tree left open"])
def test_an_example_refuses_an_argument_it_cannot_run_naming_it(arguments, message, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "unbalanced.txt").write_text("(2 (1 a) (3 b))\n(3 (2 a) (1 b)\n")
    arguments = [argument.format(empty=tmp_path / "empty.txt",
                                 unbalanced=tmp_path / "unbalanced.txt")
                 for argument in arguments]
    ran = subprocess.run([sys.executable, *arguments], cwd=EXAMPLES, capture_output=True,
                         text=True, timeout=120, check=False)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert message in ran.stderr


def test_the_treebanks_states_are_written_in_the_files_order(tmp_path, monkeypatch):
    """In batches of trees of about one height, put back by their positions."""
    import sst_states
    from tree_lstm import child_sum_tree_lstm, make_params
    lines = ["(3 (2 a) (4 (3 b) (2 c)))", "(1 d)", "(2 (2 e) (1 (0 f) (2 g)))", "(4 (4 h) (3 i))",
             "(0 (1 j) (2 (2 k) (1 (1 l) (0 m))))"]
    (tmp_path / "trees.txt").write_text("\n".join(lines) + "\n")
    output = tmp_path / "states.npy"
    monkeypatch.setattr(sys, "argv", ["sst_states.py", "--trees", str(tmp_path / "trees.txt"),
                                      "--batch", "2", "--hidden", "4", "--dtype", "float64",
                                      "--output", str(output)])
    sst_states.main()
    forest = rj.Forest.from_ptb(lines)
    expected = child_sum_tree_lstm.run(forest, make_params(4, len(forest.vocab), "float64"))
    np.testing.assert_allclose(np.load(output), expected.roots[0], rtol=1e-12)
