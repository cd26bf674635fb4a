"""examples/train_sst.py's two backends are one model: from the same initial parameters, the
TreeLSTM compiled by recjit inside PyTorch and the same cell in plain PyTorch, a level at a
time, give the same losses step after step (float64, no dropout)."""
import numpy as np
import pytest
import torch

import recjit as rj
from train_sst import Classifier, initial_parameters, optimizer

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
