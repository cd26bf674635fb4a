"""Reverse mode against PyTorch: the zoo's models written again in PyTorch, recursively, and
differentiated by its autograd, give the gradients recjit's pullback gives (float64)."""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dag_rnn import dag_rnn, make_params as dag_rnn_params
from gru import gru, make_params as gru_params
from lstm import lstm, make_params as lstm_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from simple_tree_gru import simple_tree_gru
from tree_attention import make_params as tree_attention_params, tree_attention
from tree_fc import make_params as tree_fc_params, tree_fc
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from conftest import (binary_forests, max_pooled, nary_forests, random_dags, seeds,
                      tree_convolution, vector_rnn_params, word_sequences)

torch = pytest.importorskip("torch")
HIDDEN, VOCAB = 3, 6


def zeros():
    return torch.zeros(HIDDEN, dtype=torch.float64)


def torch_tree_fc(p, node, children):
    if not children:
        return p.E[node.word]
    return torch.tanh(p.W @ torch.cat(children) + p.b)


def torch_tree_rnn(p, node, children):
    if not children:
        return p.E[node.word]
    left, right = children
    return torch.tanh(p.W @ left + p.U @ right + p.b)


def torch_tree_lstm(p, node, children):
    if not children:
        i, o, u = torch.split(p.W_iou @ p.E[node.word] + p.b_iou, HIDDEN)
        c = torch.sigmoid(i) * torch.tanh(u)
        return torch.sigmoid(o) * torch.tanh(c), c
    (hl, cl), (hr, cr) = children
    i, o, u = torch.split(p.U_iou @ (hl + hr) + p.b_iou, HIDDEN)
    c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(p.U_f @ hl + p.b_f) * cl
         + torch.sigmoid(p.U_f @ hr + p.b_f) * cr)
    return torch.sigmoid(o) * torch.tanh(c), c


def torch_child_sum_tree_lstm(p, node, children):
    h_sum = sum((h for h, _ in children), zeros())
    forgotten = sum((torch.sigmoid(p.U_f @ h + p.b_f) * c for h, c in children), zeros())
    x = p.W_iou @ p.E[node.word] if not children else 0
    i, o, u = torch.split(x + p.U_iou @ h_sum + p.b_iou, HIDDEN)
    c = torch.sigmoid(i) * torch.tanh(u) + forgotten
    return torch.sigmoid(o) * torch.tanh(c), c


def torch_tree_gru(p, node, children):
    h_sum = sum(children, zeros())
    gated = sum((torch.sigmoid(p.U_r @ h + p.b_r) * h for h in children), zeros())
    x_z, x_h = torch.split(p.W_zh @ p.E[node.word], HIDDEN) if not children else (0, 0)
    z = torch.sigmoid(x_z + p.U_z @ h_sum + p.b_z)
    return z * h_sum + (1 - z) * torch.tanh(x_h + p.U_h @ gated + p.b_h)


def torch_simple_tree_gru(p, node, children):
    h_sum = sum(children, zeros())
    gated = sum((torch.sigmoid(p.U_r @ h + p.b_r) * h for h in children), zeros())
    x_z, x_h = torch.split(p.W_zh @ p.E[node.word], HIDDEN) if not children else (0, 0)
    z = torch.sigmoid(x_z + p.U_z @ h_sum + p.b_z)
    return (1 - z) * torch.tanh(x_h + p.U_h @ gated + p.b_h)


def torch_tree_attention(p, node, children):
    if not children:
        return torch.tanh(p.E[node.word] @ p.W)
    scores = [torch.exp(torch.dot(h, p.a)) for h in children]
    context = sum(score * h for score, h in zip(scores, children)) / sum(scores)
    return torch.tanh(context @ p.U + p.b)


def torch_mv_rnn(p, node, children):
    if not children:
        return p.E[node.word], p.E_M[node.word]
    (a, A), (b, B) = children
    return torch.tanh(p.W @ torch.cat([B @ a, A @ b])), p.W_M @ torch.cat([A, B])


def torch_lstm(p, step, children):
    x = p.W @ p.E[step.word] + p.b
    h_prev, c_prev = children[0] if children else (0, 0)
    i, f, o, u = torch.split(x + (p.U @ h_prev if children else 0), HIDDEN)
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(u)
    return torch.sigmoid(o) * torch.tanh(c), c


def torch_gru(p, step, children):
    x_z, x_r, x_h = torch.split(p.W @ p.E[step.word] + p.b, HIDDEN)
    h_prev = children[0] if children else zeros()
    h_z, h_r = torch.split(p.U_zr @ h_prev, HIDDEN)
    z = torch.sigmoid(x_z + h_z)
    r = torch.sigmoid(x_r + h_r)
    return (1 - z) * h_prev + z * torch.tanh(x_h + p.U_h @ (r * h_prev))


def torch_max_pooled(p, node, children):
    """conftest.max_pooled: its running maximum from zeros as PyTorch's maximum over the
    stacked children (which splits a tie's gradient where NumPy's chain sends it to one
    side: the same parameters' gradients, as tied children here are the same subtree)."""
    pooled = torch.maximum(zeros(), torch.stack(children).amax(0)) if children else zeros()
    x = p.E[node.word] if not children else 0
    return torch.tanh(x + p.W @ pooled + p.b)


def torch_tree_convolution(p, node, children):
    """conftest.tree_convolution: each child's two products mixed by its place."""
    total = zeros()
    for place, h in enumerate(children):
        right = place / max(len(children) - 1, 1)
        total = total + (1 - right) * (p.W @ h) + right * (p.W.T @ h)
    x = p.E[node.word] if not children else 0
    return torch.tanh(x + total + p.b)


def vector_cell_params(hidden, vocab_size, dtype, seed):
    """conftest's E, W and b (float64), called as the zoo's parameter makers are."""
    return vector_rnn_params(hidden, vocab_size, seed)


def torch_dag_rnn(p, node, children):
    h_pred = sum(children, zeros())
    return torch.relu(p.W @ node.x + p.U @ h_pred + p.b)


class TorchNode:
    def __init__(self, forest, index):
        self.word = int(forest.fields["word"][index]) if "word" in forest.fields else None
        self.x = (torch.as_tensor(forest.fields["x"][index]) if "x" in forest.fields
                  else None)


def torch_states(cell, forest, p):
    """Every node's state, the recursion run children first (each node once)."""
    states = {}

    def state(index):
        if index not in states:
            children = [state(int(child)) for child in forest.children(index)]
            children = [child[0] if len(child) == 1 else child for child in children]
            value = cell(p, TorchNode(forest, index), children)
            states[index] = value if isinstance(value, tuple) else (value,)
        return states[index]

    for root in forest.roots:
        state(int(root))
    return states


MODELS = {"tree_fc": (tree_fc, torch_tree_fc, tree_fc_params, binary_forests),
          "tree_rnn": (tree_rnn, torch_tree_rnn, tree_rnn_params, binary_forests),
          "tree_lstm": (tree_lstm, torch_tree_lstm, tree_lstm_params, binary_forests),
          "child_sum_tree_lstm": (child_sum_tree_lstm, torch_child_sum_tree_lstm,
                                  tree_lstm_params, nary_forests),
          "tree_gru": (tree_gru, torch_tree_gru, tree_gru_params, nary_forests),
          "simple_tree_gru": (simple_tree_gru, torch_simple_tree_gru, tree_gru_params,
                              nary_forests),
          "tree_attention": (tree_attention, torch_tree_attention, tree_attention_params,
                             nary_forests),
          "mv_rnn": (mv_rnn, torch_mv_rnn, mv_rnn_params, binary_forests),
          "lstm": (lstm, torch_lstm, lstm_params, word_sequences),
          "gru": (gru, torch_gru, gru_params, word_sequences),
          "max_pooled": (max_pooled, torch_max_pooled, vector_cell_params, nary_forests),
          "tree_convolution": (tree_convolution, torch_tree_convolution, vector_cell_params,
                               nary_forests)}


def assert_torch_agrees(model, torch_cell, forest, p, seed):
    out, pullback = model.vjp(forest, p)
    rng = np.random.default_rng(seed)
    roots = [rng.normal(size=state.shape) for state in out.roots]
    nodes = [rng.normal(size=state.shape) for state in out.nodes]
    gradients = pullback(roots=tuple(roots) if len(roots) > 1 else roots[0],
                         nodes=tuple(nodes) if len(nodes) > 1 else nodes[0])
    weights = {name: torch.tensor(getattr(p, name), requires_grad=True) for name in vars(p)}
    states = torch_states(torch_cell, forest, SimpleNamespace(**weights))
    loss = sum((states[int(root)][c] * torch.as_tensor(roots[c][position])).sum()
               for position, root in enumerate(forest.roots) for c in range(len(roots)))
    loss = loss + sum((states[node][c] * torch.as_tensor(nodes[c][node])).sum()
                      for node in states for c in range(len(nodes)))
    loss.backward()
    for name, weight in weights.items():
        expected = weight.grad.numpy() if weight.grad is not None else np.zeros(weight.shape)
        np.testing.assert_allclose(np.asarray(getattr(gradients.params, name)), expected,
                                   rtol=1e-9, atol=1e-12, err_msg=f"parameter {name}")


FORESTS = {binary_forests: binary_forests(VOCAB, max_trees=3, max_leaves=5),
           nary_forests: nary_forests(VOCAB, max_trees=3, max_leaves=7, max_children=6),
           word_sequences: word_sequences(VOCAB, max_length=5, max_sequences=2)}


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=3)
@given(data=st.data(), seed=seeds)
def test_pytorch_autograd_of_the_same_model_gives_the_same_gradients(name, data, seed):
    model, torch_cell, make, forests = MODELS[name]
    assert_torch_agrees(model, torch_cell, data.draw(FORESTS[forests]),
                        make(HIDDEN, VOCAB, "float64", seed % 5), seed)


@settings(max_examples=3)
@given(forest=random_dags(HIDDEN, max_nodes=8), seed=seeds)
def test_pytorch_autograd_of_dag_rnn_gives_the_same_gradients(forest, seed):
    assert_torch_agrees(dag_rnn, torch_dag_rnn, forest,
                        dag_rnn_params(HIDDEN, dtype="float64", seed=seed % 5), seed)
