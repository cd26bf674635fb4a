"""examples/train_sst.py's two backends are one model: from the same initial parameters, the
TreeLSTM compiled by recjit inside PyTorch and the same cell in plain PyTorch, a level at a
time, give the same losses step after step (float64, no dropout)."""
import json
import re
import sys

import numpy as np
import pytest
import torch

import recjit as rj
import train_sst
from train_sst import Classifier, end_process, initial_parameters, optimizer

TREES = ["(3 (2 (1 a) (3 b)) (4 (2 c) (3 d)))", "(1 (0 (1 e) (2 f)) (2 g))", "(2 h)",
         "(4 (3 (3 a) (4 (2 b) (4 i))) (2 j))"]


def losses(backend, cell, forest, initial, steps):
    torch.manual_seed(0)
    model = Classifier(backend, initial, dropout=0.0, cell=cell)
    adagrad = optimizer(model, lr=0.05, embedding_lr=0.1, weight_decay=1e-4)
    labels = torch.from_numpy(forest.fields["label"])
    result = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(forest), labels, reduction="sum")
        adagrad.zero_grad()
        loss.backward()
        adagrad.step()
        result.append(loss.item())
    return result


@pytest.mark.parametrize("cell", ["childsum", "nary"])
def test_recjit_and_plain_pytorch_give_the_same_losses_step_after_step(cell):
    vocab = {}
    forest = rj.Forest.from_ptb(TREES, vocab=vocab)
    initial = initial_parameters(len(vocab), 4, 3, seed=0, dtype="float64")
    recjit_losses = losses("recjit", cell, forest, initial, 3)
    np.testing.assert_allclose(recjit_losses, losses("torch", cell, forest, initial, 3),
                               rtol=1e-9)
    assert recjit_losses[2] < recjit_losses[0]


DDP_TREES = 24


def ddp_data():
    """24 random trees of SST's shape, labelled at every node, and the float64 initial
    parameters of the classifier."""
    forest = rj.Forest.random_binary(DDP_TREES, seed=11, mean_leaves=6, vocab_size=30)
    forest.fields["label"] = np.random.default_rng(12).integers(0, 5, forest.num_nodes)
    return forest, initial_parameters(30, 4, 3, seed=1, dtype="float64")


def one_sgd_step(model, forest):
    """The mean cross-entropy over the forest's roots' trees (every node labelled), one step
    of plain SGD: what DistributedDataParallel's averaged gradients reproduce exactly."""
    sgd = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = torch.nn.functional.cross_entropy(model(forest), torch.from_numpy(
        forest.fields["label"]), reduction="sum") / forest.roots.size
    sgd.zero_grad()
    loss.backward()
    sgd.step()


def ddp_worker(rank, port, path):
    """Worker `rank` of 2: half the trees, one step under DistributedDataParallel (gloo)."""
    torch.set_num_threads(1)
    rj.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=2)
    try:
        forest, initial = ddp_data()
        half = DDP_TREES // 2
        model = Classifier("recjit", initial, dropout=0.0)
        one_sgd_step(torch.nn.parallel.DistributedDataParallel(model),
                     forest.select(range(rank * half, (rank + 1) * half)))
        if rank == 0:
            torch.save(model.state_dict(), path)
    finally:
        torch.distributed.destroy_process_group()
    end_process()


def test_a_step_of_two_ddp_processes_of_12_trees_is_a_step_of_one_process_of_24(tmp_path):
    from train_sst import free_port
    forest, initial = ddp_data()
    model = Classifier("recjit", initial, dropout=0.0)
    one_sgd_step(model, forest)
    path = str(tmp_path / "worker0.pt")
    torch.multiprocessing.spawn(ddp_worker, args=(free_port(), path), nprocs=2)
    workers = torch.load(path)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(workers[name].numpy(), value.numpy(), rtol=1e-5, atol=1e-8,
                                   err_msg=name)
    assert not np.allclose(model.state_dict()["out.weight"].numpy(), initial["W_out"])


def test_the_plain_pytorch_classifier_computes_where_its_parameters_are():
    """On PyTorch's meta device an op given a CPU tensor raises: every tensor the forward
    makes goes where the parameters are, as `.to("cuda")` needs on a GPU."""
    forest = rj.Forest.random_binary(3, seed=1, mean_leaves=5, vocab_size=30)
    model = Classifier("torch", initial_parameters(30, 4, 3, seed=1, dtype="float64"),
                       dropout=0.0).to("meta")
    scores = model(forest)
    assert scores.device.type == "meta"
    assert scores.shape == (forest.num_nodes, 5)


@pytest.mark.parametrize("arguments, message", [
    (["--data", "{empty}"], "no train.txt, dev.txt, test.txt there"),
    (["--batch", "0"], "argument --batch: must be at least 1, not 0"),
    (["--dropout", "1.5"], r"argument --dropout: must be in \[0, 1\), not 1.5"),
    (["--lr", "-1"], "argument --lr: must be a number above 0, not -1.0"),
    (["--weight-decay", "nan"], "argument --weight-decay: must be a number from 0 up, not nan"),
    (["--data", "{treebank}", "--limit", "30", "--workers", "3"],
     "30 training trees in batches of 25 make fewer batches than the 3 workers")],
    ids=["a directory without the treebank", "an empty batch", "a dropout of more than 1",
         "a negative learning rate", "a weight decay not a number",
         "fewer batches than workers"])
def test_the_scripts_bad_arguments_are_refused_naming_them(arguments, message, tmp_path,
                                                            monkeypatch, capsys):
    (tmp_path / "treebank").mkdir()
    arguments = [argument.format(empty=tmp_path, treebank=treebank(tmp_path / "treebank", 40))
                 for argument in arguments]
    monkeypatch.setattr(sys, "argv", ["train_sst.py", *arguments])
    with pytest.raises(SystemExit):
        train_sst.main()
    assert re.search(message, capsys.readouterr().err)


def treebank(directory, trees):
    """A directory of train.txt, dev.txt and test.txt, each `trees` of TREES in turn."""
    for name in ("train.txt", "dev.txt", "test.txt"):
        (directory / name).write_text("".join(TREES[i % len(TREES)] + "\n"
                                              for i in range(trees)))
    return str(directory)


def test_a_training_set_smaller_than_a_batch_trains_in_one_step(tmp_path, monkeypatch):
    """The plain PyTorch backend: the script's epoch, without a kernel to compile (nor
    matplotlib, which the test extra leaves out, to plot it)."""
    record = tmp_path / "record"
    monkeypatch.setattr(train_sst, "plot", lambda record, path: None)
    monkeypatch.setattr(sys, "argv", [
        "train_sst.py", "--data", treebank(tmp_path, 10), "--backend", "torch", "--epochs", "1",
        "--embedding", "4", "--hidden", "3", "--record", str(record)])
    train_sst.main()
    epochs = json.loads((tmp_path / "record.json").read_text())["epochs"]
    assert len(epochs) == 1 and np.isfinite(epochs[0]["loss_per_node"])
