"""The examples' command lines refuse what they cannot run, naming the argument, before
anything compiles."""
import os
import subprocess
import sys

import pytest

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
