"""The benchmark scripts refuse arguments they cannot run with, by name, before any work."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench  # noqa: E402
import bench_training  # noqa: E402


def refusal(main, arguments, monkeypatch, capsys):
    """What `main` run with `arguments` writes to stderr as argparse refuses them."""
    monkeypatch.setattr(sys, "argv", ["script.py", *arguments])
    with pytest.raises(SystemExit):
        main()
    return capsys.readouterr().err


def test_a_model_not_in_the_zoo_is_refused_listing_the_zoo(monkeypatch, capsys):
    error = refusal(bench.main, ["--models", "tree_lstm,nope"], monkeypatch, capsys)
    assert "argument --models: no model 'nope' in the zoo: tree_fc, tree_rnn" in error


def test_the_training_benchmark_refuses_a_directory_without_the_treebank(monkeypatch, capsys,
                                                                          tmp_path):
    error = refusal(bench_training.main, ["--data", str(tmp_path)], monkeypatch, capsys)
    assert f"--data {tmp_path}: no train.txt there" in error
