"""recjit as a PyTorch layer (`recjit.torch`): its states are the run's, and autograd's
gradients through it are the pullback's, for parameters, gathered tables (sparse or dense),
fields computed upstream and context arguments."""
import copy
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import recjit as rj
from recjit.autodiff.pullback import Pullback
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params

from conftest import nary_forests, seeds
from test_gradients import HIDDEN, VOCAB, ZOO, fielded, kinked

FORESTS = nary_forests(VOCAB, max_trees=3, max_leaves=6, max_children=4)
few = settings(max_examples=2)


def module(dtype="float64", seed=0, sparse=()):
    return rj.torch.Module(child_sum_tree_lstm, sparse=sparse,
                           **vars(tree_lstm_params(HIDDEN, VOCAB, dtype, seed)))


@few
@given(forest=FORESTS, seed=seeds)
def test_a_layers_states_are_the_runs(forest, seed):
    layer = module(seed=seed % 7)
    out = layer(forest)
    expected = child_sum_tree_lstm.run(forest, tree_lstm_params(HIDDEN, VOCAB, "float64",
                                                                seed % 7))
    for got, want in zip(out.nodes + out.roots, expected.nodes + expected.roots):
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12, atol=1e-12)


@few
@given(forest=FORESTS, seed=seeds)
def test_autograd_through_a_layer_gives_the_pullbacks_gradients(forest, seed):
    layer = module(seed=seed % 7)
    out = layer(forest)
    rng = np.random.default_rng(seed)
    roots, nodes = rng.normal(size=out.roots[0].shape), rng.normal(size=out.nodes[1].shape)
    ((out.roots[0] * torch.from_numpy(roots)).sum()
     + (out.nodes[1] * torch.from_numpy(nodes)).sum()).backward()
    _, pullback = child_sum_tree_lstm.vjp(forest, tree_lstm_params(HIDDEN, VOCAB, "float64",
                                                                   seed % 7))
    expected = pullback(roots=(roots, None), nodes=(None, nodes))
    for name, parameter in layer.named_parameters():
        np.testing.assert_allclose(parameter.grad.numpy(),
                                   np.asarray(getattr(expected.params, name)),
                                   rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("nothing_differentiated", ["under no_grad", "no tensor requires grad"])
def test_a_call_with_nothing_to_differentiate_runs_the_model_without_a_vjp(
        nothing_differentiated, monkeypatch):
    """An evaluation keeps no products and copies no parameters for a pullback it never
    calls."""
    forest = rj.Forest.random_binary(2, seed=1, mean_leaves=4, vocab_size=VOCAB)
    layer = module()
    expected = layer(forest)

    def refused(*arguments, **keywords):
        raise AssertionError("vjp was called")

    monkeypatch.setattr(child_sum_tree_lstm, "vjp", refused)
    if nothing_differentiated == "under no_grad":
        with torch.no_grad():
            out = layer(forest)
    else:
        out = rj.torch.apply(child_sum_tree_lstm, forest,
                             {name: value.detach() for name, value in layer.named_parameters()})
    for got, want in zip(out.nodes + out.roots, expected.nodes + expected.roots):
        assert not got.requires_grad
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_a_gathered_tables_gradient_is_sparse_when_asked_and_dense_otherwise():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    gradients = {}
    for sparse in ((), ("E",)):
        layer = module(sparse=sparse)
        layer(forest).roots[0].sum().backward()
        gradients[sparse] = layer.E.grad
    assert gradients[("E",)].is_sparse and not gradients[()].is_sparse
    used = np.unique(forest.fields["word"][forest.fields["word"] >= 0])
    assert sorted(gradients[("E",)].coalesce().indices()[0].tolist()) == used.tolist()
    np.testing.assert_allclose(gradients[("E",)].to_dense().numpy(), gradients[()].numpy(),
                               rtol=1e-12)


def test_a_sparse_gradient_reaches_its_tensor_marked_coalesced():
    """Its rows are unique and sorted; PyTorch's accumulation would hand it on unmarked, and
    an optimizer would sort it again."""
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    layer = module(sparse=("E",))
    for _ in range(2):  # one hook a tensor, however many calls
        layer.zero_grad()
        layer(forest).roots[0].sum().backward()
        assert layer.E.grad.is_coalesced()
    assert len(layer.E._post_accumulate_grad_hooks) == 1
    dense = module()
    dense(forest).roots[0].sum().backward()
    np.testing.assert_allclose(layer.E.grad.to_dense().numpy(), dense.E.grad.numpy(),
                               rtol=1e-12)


def test_a_sparse_gradient_summed_with_another_is_left_as_pytorch_sums_it():
    """A table also read by an `nn.Embedding(sparse=True)` lookup gets the two gradients'
    rows side by side, a row listed twice: not coalesced, and not marked so."""
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    layer = module(sparse=("E",))
    words = torch.from_numpy(forest.fields["word"][forest.fields["word"] >= 0])
    lookup = torch.nn.functional.embedding(words, layer.E, sparse=True)
    (layer(forest).roots[0].sum() + lookup.sum()).backward()
    dense = module()
    (dense(forest).roots[0].sum()
     + torch.nn.functional.embedding(words, dense.E).sum()).backward()
    assert not layer.E.grad.is_coalesced()
    np.testing.assert_allclose(layer.E.grad.to_dense().numpy(), dense.E.grad.numpy(),
                               rtol=1e-12)


def test_one_sparse_table_may_be_named_by_a_string():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    layer = module(sparse="E")
    layer(forest).roots[0].sum().backward()
    assert layer.E.grad.is_sparse and not layer.U_iou.grad.is_sparse


def test_a_sparse_name_that_is_not_a_parameter_is_refused_naming_it():
    """By the module as it is made, and by `apply` at its call."""
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    with pytest.raises(rj.InputError, match="sparse names 'Ee', which is not among the "
                                            "parameters"):
        module(sparse=("Ee",))
    with pytest.raises(rj.InputError, match="sparse names 'Ee', which is not among the "
                                            "parameters"):
        rj.torch.apply(child_sum_tree_lstm, forest, dict(module().named_parameters()),
                       sparse="Ee")


def test_a_sparse_name_of_a_multiplied_parameter_is_refused_naming_it():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    out = module(sparse=("U_iou",))(forest)
    with pytest.raises(rj.InputError, match="sparse names 'U_iou', whose gradient is dense"):
        out.roots[0].sum().backward()


@pytest.mark.parametrize("view", [lambda table: torch.cat([table, table], dim=1)[:, ::2],
                                  lambda table: torch.cat([table, table])[:VOCAB],
                                  lambda table: table.view(table.shape),
                                  lambda table: table.t().t()],
                         ids=["columns", "rows", "view", "transposed twice"])
def test_a_sparse_table_that_is_a_view_of_another_tensor_is_refused_at_the_call(view):
    """PyTorch's backward of a view takes no sparse gradient: refused before the forward
    runs, naming the table, where `backward()` would fail inside PyTorch."""
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    params = dict(module().named_parameters())
    params["E"] = view(params["E"])
    with pytest.raises(rj.InputError, match="sparse names 'E', a view of another tensor"):
        rj.torch.apply(child_sum_tree_lstm, forest, params, sparse="E")


def test_a_dense_gradient_reaches_a_table_through_a_view():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    params = dict(module().named_parameters())
    wide = torch.zeros(VOCAB, 2 * HIDDEN, dtype=torch.float64)
    wide[:, ::2] = params["E"].detach()
    wide.requires_grad_()
    params["E"] = wide[:, ::2]
    rj.torch.apply(child_sum_tree_lstm, forest, params).roots[0].sum().backward()
    expected = module()
    expected(forest).roots[0].sum().backward()
    np.testing.assert_allclose(wide.grad[:, ::2].numpy(), expected.E.grad.numpy(),
                               rtol=1e-12, atol=1e-12)
    assert not wide.grad[:, 1::2].any()


def test_a_model_that_is_not_a_recursive_model_is_refused_naming_it():
    """By `apply` at its call and by the module as it is made."""
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    with pytest.raises(rj.InputError, match="runs a recursive model .*not function"):
        rj.torch.apply(child_sum_tree_lstm.function, forest, dict(module().named_parameters()))
    with pytest.raises(rj.InputError, match="runs a recursive model .*not function"):
        rj.torch.Module(child_sum_tree_lstm.function, **vars(tree_lstm_params(HIDDEN, VOCAB)))


def test_a_backward_after_an_in_place_update_is_refused_naming_the_parameter():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=4, vocab_size=VOCAB)
    layer = module()
    loss = layer(forest).roots[0].sum()
    with torch.no_grad():
        layer.U_iou.add_(1.0)  # an optimizer's step before the backward
    with pytest.raises(rj.InputError, match="parameter 'U_iou' changed in place after the "
                                            "forward"):
        loss.backward()


def test_a_fields_gradient_flows_into_the_layer_that_computed_it():
    """An `nn.Embedding` upstream makes every node's vector field `x`."""
    forest = rj.Forest.random_binary(2, seed=1, mean_leaves=4, vocab_size=VOCAB)
    rng = np.random.default_rng(0)
    params = {name: torch.from_numpy(rng.normal(size=shape) / 2)
              for name, shape in (("E", (VOCAB, HIDDEN)), ("W", (HIDDEN, HIDDEN)),
                                  ("U", (HIDDEN, HIDDEN)))}
    embedding = torch.nn.Embedding(VOCAB + 1, HIDDEN, dtype=torch.float64)
    words = torch.from_numpy(forest.fields["word"]).clamp(min=-1) + 1  # internal nodes: row 0
    x = embedding(words)
    rj.torch.apply(fielded, forest, params, fields={"x": x}).roots[0].sum().backward()
    _, pullback = fielded.vjp(rj.Forest(forest.child_ptr, forest.child_idx, forest.roots,
                                        {**forest.fields, "x": x.detach().numpy()}, forest.kind),
                              rj.Params(**{k: v.numpy() for k, v in params.items()}))
    per_node = pullback(roots=np.ones((forest.roots.size, HIDDEN))).fields["x"]
    expected = np.zeros((VOCAB + 1, HIDDEN))
    np.add.at(expected, words.numpy(), per_node)
    np.testing.assert_allclose(embedding.weight.grad.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_a_modules_state_dict_round_trips_and_double_runs_in_float64():
    forest = rj.Forest.random_binary(2, seed=2, mean_leaves=4, vocab_size=VOCAB)
    layer, other = module("float32", seed=0), module("float32", seed=1)
    other.load_state_dict(layer.state_dict())
    np.testing.assert_array_equal(other(forest).roots[0].detach().numpy(),
                                  layer(forest).roots[0].detach().numpy())
    assert layer.double()(forest).roots[0].dtype == torch.float64


def test_a_module_prints_its_model_parameter_shapes_dtype_and_sparse_tables():
    text = repr(module("float32", sparse=("E",)))
    assert text.startswith(f"Module(model=child_sum_tree_lstm, E=({VOCAB}, {HIDDEN}), ")
    assert text.endswith(", float32, sparse=('E',))")


def module_of_a_local_model(seed):
    """A module around a model defined in a function: as in a notebook, not importable."""
    @rj.recursive_model(arity=2)
    def local_rnn(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return rj.tanh(p.W @ (local_rnn(node.left, p) + local_rnn(node.right, p)))

    rng = np.random.default_rng(seed)
    return rj.torch.Module(local_rnn, E=rng.normal(size=(VOCAB, 4)),
                           W=rng.normal(size=(4, 4)) / 2)


def test_a_deep_copy_of_a_module_keeps_its_parameters_as_they_were():
    """The best epoch's snapshot, as training loops take it, of a local model's module too."""
    forest = rj.Forest.random_binary(2, seed=3, mean_leaves=4, vocab_size=VOCAB)
    layer = module_of_a_local_model(seed=0)
    before = layer(forest).roots[0].detach().clone()
    snapshot = copy.deepcopy(layer)
    layer(forest).roots[0].sum().backward()
    torch.optim.SGD(layer.parameters(), lr=0.5).step()
    assert not torch.equal(layer(forest).roots[0].detach(), before)
    assert torch.equal(snapshot(forest).roots[0].detach(), before)


def test_torch_save_of_a_module_around_a_local_model_loads_and_runs_the_same():
    """A whole module saved, as scripts do beside their state_dict: the model is pickled by
    value, and the loaded module holds a new model of the same cell."""
    forest = rj.Forest.random_binary(2, seed=4, mean_leaves=4, vocab_size=VOCAB)
    layer = module_of_a_local_model(seed=1)
    saved = io.BytesIO()
    torch.save(layer, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert loaded.model is not layer.model
    assert torch.equal(loaded(forest).roots[0], layer(forest).roots[0])


@pytest.mark.parametrize("loss", [lambda roots: roots.sum(), lambda roots: (roots ** 2).sum()],
                         ids=["cotangents that need no gradient", "cotangents that need one"])
def test_a_second_derivative_is_refused_clearly(loss):
    """Asked with create_graph=True: refused at once. PyTorch's `once_differentiable`
    refused it only where the cotangents need a gradient; for a plain sum, a gradient
    penalty's gradient silently left out recjit's second derivative."""
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    layer = module()
    with pytest.raises(rj.RecJitError, match="no derivative of its own: a second derivative"):
        torch.autograd.grad(loss(layer(forest).roots[0]), [layer.b_f], create_graph=True)


@pytest.mark.parametrize("transform", [torch.func.grad, torch.func.vmap, torch.func.jacrev],
                         ids=["grad", "vmap", "jacrev"])
def test_a_torch_func_transform_of_a_layer_is_refused_saying_what_to_use(transform):
    forest = rj.Forest.random_binary(2, seed=2, mean_leaves=4, vocab_size=VOCAB)
    layer = module()
    params = dict(layer.named_parameters())

    def loss(U_iou):
        return rj.torch.apply(child_sum_tree_lstm, forest,
                              {**params, "U_iou": U_iou}).roots[0].sum()

    with pytest.raises(rj.RecJitError, match="per_tree=True"):
        transform(loss)(params["U_iou"].detach()[None] if transform is torch.func.vmap
                        else params["U_iou"].detach())


def test_under_torch_compile_a_layer_runs_eagerly_with_eagers_loss_and_gradients():
    """Dynamo leaves the layer out of its graphs and does not trace into recjit (its
    compiling, its kernels' calls), where it would make a dozen graphs between breaks."""
    import torch._dynamo

    forest = rj.Forest.random_binary(2, seed=4, mean_leaves=4, vocab_size=VOCAB)
    layer, classifier = module(), torch.nn.Linear(HIDDEN, 3).double()

    def loss():
        return classifier(layer(forest).nodes[0]).logsumexp(1).sum()

    eager = loss()
    eager_gradient = torch.autograd.grad(eager, layer.U_iou)[0]
    assert torch._dynamo.explain(loss)().graph_count == 1  # the classifier and the sum
    compiled = torch.compile(loss, backend="eager")()
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.autograd.grad(compiled, layer.U_iou)[0], eager_gradient,
                               rtol=1e-12, atol=0)


def test_an_unknown_backend_is_refused_naming_it():
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    layer = module()
    with pytest.raises(rj.RecJitError, match="not backend='tpu'"):
        rj.torch.apply(child_sum_tree_lstm, forest, dict(layer.named_parameters()),
                       backend="tpu")


def test_a_layer_on_the_gpu_gives_the_cpu_layers_states_and_gradients():
    """`backend="cuda"`: the forward and the backward on the GPU (numba's simulator without
    one), from and to CPU tensors."""
    forest = rj.Forest.from_ptb(["(3 (2 (1 a) (3 b)) (4 c))", "(0 (1 d) (0 (2 e) (1 f)))"])
    layers = [rj.torch.Module(child_sum_tree_lstm, backend=backend,
                              **vars(tree_lstm_params(HIDDEN, VOCAB, "float64", 2)))
              for backend in ("cpu", "cuda")]
    weights = torch.from_numpy(np.random.default_rng(3).normal(size=(forest.num_nodes, HIDDEN)))
    for layer in layers:
        (layer(forest).nodes[0] * weights).sum().backward()
    cpu, gpu = (dict(layer.named_parameters()) for layer in layers)
    for name in cpu:
        np.testing.assert_allclose(gpu[name].grad.numpy(), cpu[name].grad.numpy(),
                                   rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(layers[1](forest).roots[0].detach().numpy(),
                               layers[0](forest).roots[0].detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("name", ["tree_lstm", "child_sum_tree_lstm", "tree_gru"])
def test_gradcheck_of_a_zoo_layer_with_respect_to_its_parameters(name):
    model, make, _ = ZOO[name]
    forest = rj.Forest.from_nested([((0, 1), (2, 3)), (4, 5)])
    p = make(HIDDEN, VOCAB, "float64", 1)
    names = sorted(vars(p))
    tensors = [torch.tensor(getattr(p, n), requires_grad=True) for n in names]

    def roots(*values):
        return rj.torch.apply(model, forest, dict(zip(names, values))).roots[0]

    assert torch.autograd.gradcheck(roots, tensors, eps=1e-6, atol=1e-6)


def test_gradcheck_with_respect_to_a_field_and_a_context_argument():
    forest = rj.Forest.from_nested([((0, 1), (2, 3)), (4, 5)])
    rng = np.random.default_rng(0)
    E, W = (torch.tensor(rng.normal(size=shape), requires_grad=True)
            for shape in ((VOCAB, HIDDEN), (HIDDEN, HIDDEN)))
    floor = torch.tensor(rng.normal(size=HIDDEN) * 0.3, requires_grad=True)
    x = torch.tensor(rng.normal(size=(forest.num_nodes, HIDDEN)), requires_grad=True)
    U = torch.tensor(rng.normal(size=(HIDDEN, HIDDEN)) / 2, requires_grad=True)

    def kinked_roots(E, W, floor):
        return rj.torch.apply(kinked, forest, {"E": E, "W": W}, context=(floor,)).roots[0]

    def fielded_roots(E, W, U, x):
        return rj.torch.apply(fielded, forest, {"E": E, "W": W, "U": U},
                              fields={"x": x}).roots[0]

    assert torch.autograd.gradcheck(kinked_roots, (E, W, floor), eps=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(fielded_roots, (E, W / 2, U, x), eps=1e-6, atol=1e-6)


def test_three_steps_of_training_lower_the_loss():
    forest = rj.Forest.from_ptb(["(3 (2 (1 a) (3 b)) (4 c))", "(0 (1 d) (0 (2 e) (1 f)))"])
    layer = module(seed=4)
    torch.manual_seed(0)  # the classifier's initial weights: at some, lr=0.5 overshot
    classifier = torch.nn.Linear(HIDDEN, 5, dtype=torch.float64)
    labels = torch.from_numpy(forest.fields["label"])
    optimizer = torch.optim.Adagrad(list(layer.parameters()) + list(classifier.parameters()),
                                    lr=0.1)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(classifier(layer(forest).nodes[0]), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[2] < losses[1] < losses[0]


@pytest.mark.parametrize("change, message", [
    (lambda p: {**p, "W_iou": p["W_iou"][:, :2]}, "W_iou"),
    (lambda p: {**p, "b_f": p["b_f"].int()}, "b_f"),
    (lambda p: {k: v for k, v in p.items() if k != "U_f"}, "U_f"),
], ids=["a wrong shape", "a wrong dtype", "a missing parameter"])
def test_a_parameter_that_does_not_fit_the_cell_is_refused_naming_it(change, message):
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    params = {name: value.detach() for name, value in module().named_parameters()}
    with pytest.raises(rj.RecJitError, match=message):
        rj.torch.apply(child_sum_tree_lstm, forest, change(params))


def test_parameters_not_given_by_name_are_refused():
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    with pytest.raises(rj.InputError, match="params must be a dict"):
        rj.torch.apply(child_sum_tree_lstm, forest, list(module().parameters()))


def test_a_modules_initial_parameter_that_is_not_numbers_is_refused_naming_it():
    initial = vars(tree_lstm_params(HIDDEN, VOCAB, "float64", 0))
    with pytest.raises(rj.InputError, match="initial parameter 'E' holds <U3, not numbers"):
        rj.torch.Module(child_sum_tree_lstm, **{**initial, "E": "abc"})


def test_a_modules_ragged_initial_parameter_is_refused_naming_it():
    initial = vars(tree_lstm_params(HIDDEN, VOCAB, "float64", 0))
    with pytest.raises(rj.InputError, match="parameter 'E' is not an array"):
        rj.torch.Module(child_sum_tree_lstm, **{**initial, "E": [[1.0, 2.0], [3.0]]})


def test_a_modules_unknown_backend_is_refused_as_it_is_made():
    with pytest.raises(rj.RecJitError, match="not backend='tpu'"):
        rj.torch.Module(child_sum_tree_lstm, backend="tpu",
                        **vars(tree_lstm_params(HIDDEN, VOCAB, "float64", 0)))


def test_fields_that_are_not_a_dict_are_refused_saying_what_they_must_be():
    forest = rj.Forest.from_nested([(0, 1)])
    with pytest.raises(rj.InputError, match=r"fields must be a dict \{name: tensor\}"):
        module()(forest, fields=[torch.zeros(forest.num_nodes, HIDDEN)])


@pytest.mark.parametrize("context", [0.5, torch.tensor(0.5)], ids=["a number", "a tensor"])
def test_a_context_that_is_not_a_tuple_is_refused_showing_the_tuple(context):
    forest = rj.Forest.from_nested([(0, 1)])
    with pytest.raises(rj.InputError, match=r"context= takes the cell's arguments after p as "
                                            r"a tuple, context=\(value,\) for one"):
        module()(forest, context=context)


def test_a_field_with_a_row_per_node_missing_is_refused_naming_it():
    forest = rj.Forest.from_nested([(0, 1)])
    params = {name: torch.zeros(shape, dtype=torch.float64)
              for name, shape in (("E", (VOCAB, HIDDEN)), ("W", (HIDDEN, HIDDEN)),
                                  ("U", (HIDDEN, HIDDEN)))}
    with pytest.raises(rj.InputError, match="field 'x' has 1 row, where the forest has 3 "
                                            "nodes"):
        rj.torch.apply(fielded, forest, params, fields={"x": torch.zeros(1, HIDDEN)})


def test_a_tensor_the_cell_does_not_read_gets_no_gradient_and_the_others_theirs():
    """A parameter or a float field the cell ignores, and an integer field, are inputs autograd
    gives nothing back to; the parameters the cell reads get their gradients."""
    forest = rj.Forest.random_binary(2, seed=4, mean_leaves=4, vocab_size=VOCAB)
    params = {name: value.detach().requires_grad_() for name, value
              in module().named_parameters()}
    unused = torch.ones(3, dtype=torch.float64, requires_grad=True)
    unread = torch.ones(forest.num_nodes, 2, dtype=torch.float64, requires_grad=True)
    words = torch.from_numpy(forest.fields["word"])
    rj.torch.apply(child_sum_tree_lstm, forest, {**params, "unused": unused},
                   fields={"x": unread, "word": words}).nodes[0].sum().backward()
    assert unused.grad is None and unread.grad is None
    assert all(value.grad is not None for value in params.values())


@pytest.mark.parametrize("replaced, message", [
    (lambda weight: torch.empty(weight.shape, dtype=torch.float64, device="meta"), "is on meta"),
    (lambda weight: weight.detach().to_sparse(), "is a torch.sparse_coo tensor")],
    ids=["a device other than cpu or cuda", "a sparse tensor"])
def test_a_tensor_recjit_cannot_read_is_refused_naming_it(replaced, message):
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    params = dict(module().named_parameters())
    params["U_f"] = replaced(params["U_f"])
    with pytest.raises(rj.InputError, match=f"parameter 'U_f' {message}"):
        rj.torch.apply(child_sum_tree_lstm, forest, params)


def test_a_tensor_that_requires_grad_given_to_a_plain_call_is_refused_saying_what_to_do():
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    params = rj.Params(**vars(tree_lstm_params(HIDDEN, VOCAB, "float64")))
    params.U_f = torch.from_numpy(params.U_f).requires_grad_()
    with pytest.raises(rj.InputError, match=r"parameter 'U_f' is a PyTorch tensor that requires "
                                            r"grad; .*`.detach\(\)`, or call the model through "
                                            r"rj.torch.apply or rj.torch.Module"):
        child_sum_tree_lstm.run(forest, params)


def test_a_forest_refuses_a_field_that_requires_grad_saying_where_it_goes():
    x = torch.ones(3, HIDDEN, dtype=torch.float64, requires_grad=True)
    with pytest.raises(rj.InputError, match=r"field 'x' is a PyTorch tensor that requires grad; "
                                            r".*rj.torch.apply's \(or Module's\) fields="):
        rj.Forest.from_edges(3, [(0, 1), (0, 2)], fields={"x": x})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_tensor_of_half_floats_is_refused_naming_it(dtype):
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    with pytest.raises(rj.InputError, match=f"parameter 'E' holds {dtype}"):
        module().to(dtype)(forest)


needs_cuda_torch = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="needs a CUDA build of PyTorch and a GPU")


@needs_cuda_torch
def test_cuda_tensors_give_the_cpu_tensors_states_and_gradients_on_their_device():
    """A `Module` moved to the GPU computes there (`backend="cuda"` implied), reading its
    parameters in place; its states and gradients are CUDA tensors, sparse ones too."""
    forest = rj.Forest.from_ptb(["(3 (2 (1 a) (3 b)) (4 c))", "(0 (1 d) (0 (2 e) (1 f)))"])
    layers = [module(sparse=("E",)), module(sparse=("E",)).to("cuda")]
    weights = np.random.default_rng(3).normal(size=(forest.num_nodes, HIDDEN))
    states = []
    for layer in layers:
        out = layer(forest)
        states.append(out.roots[0].detach().cpu().numpy())
        (out.nodes[0] * torch.from_numpy(weights).to(out.nodes[0].device)).sum().backward()
    np.testing.assert_allclose(states[1], states[0], rtol=1e-12)
    cpu, gpu = (dict(layer.named_parameters()) for layer in layers)
    for name in cpu:
        assert gpu[name].grad.device.type == "cuda"
        np.testing.assert_allclose(gpu[name].grad.to_dense().cpu().numpy(),
                                   cpu[name].grad.to_dense().numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)


@needs_cuda_torch
def test_a_cuda_module_under_no_grad_runs_on_the_gpu_without_a_vjp(monkeypatch):
    forest = rj.Forest.from_ptb(["(3 (2 (1 a) (3 b)) (4 c))", "(0 (1 d) (0 (2 e) (1 f)))"])
    expected = module()(forest)

    def refused(*arguments, **keywords):
        raise AssertionError("vjp was called")

    monkeypatch.setattr(child_sum_tree_lstm, "vjp", refused)
    with torch.no_grad():
        out = module().to("cuda")(forest)
    for got, want in zip(out.nodes + out.roots, expected.nodes + expected.roots):
        assert got.device.type == "cuda"
        np.testing.assert_allclose(got.cpu().numpy(), want.detach().numpy(), rtol=1e-12)


@needs_cuda_torch
def test_a_cuda_modules_dense_gradients_stay_on_the_device(monkeypatch):
    """The backward asks the pullback for its dense gradients on the GPU, where the compiled
    backward sums them, not for a copy to the host and back."""
    asked = []
    call = Pullback.__call__

    def recorded(self, *arguments, **options):
        asked.append(options.get("device_output"))
        return call(self, *arguments, **options)

    monkeypatch.setattr(Pullback, "__call__", recorded)
    forest = rj.Forest.from_ptb(["(3 (2 (1 a) (3 b)) (4 c))"])
    layer = module(sparse=("E",)).to("cuda")
    layer(forest).roots[0].sum().backward()
    assert asked == [True]
    assert all(parameter.grad.device.type == "cuda" for parameter in layer.parameters())


@needs_cuda_torch
def test_a_cuda_field_computed_upstream_gets_the_cpu_fields_gradient():
    forest = rj.Forest.random_binary(2, seed=1, mean_leaves=4, vocab_size=VOCAB)
    rng = np.random.default_rng(0)
    params = {name: rng.normal(size=shape) / 2 for name, shape in
              (("E", (VOCAB, HIDDEN)), ("W", (HIDDEN, HIDDEN)), ("U", (HIDDEN, HIDDEN)))}
    words = torch.from_numpy(forest.fields["word"]).clamp(min=-1) + 1
    grads = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(VOCAB + 1, HIDDEN, dtype=torch.float64).to(device)
        tensors = {name: torch.from_numpy(value).to(device) for name, value in params.items()}
        out = rj.torch.apply(fielded, forest, tensors, fields={"x": embedding(words.to(device))})
        out.roots[0].sum().backward()
        grads.append(embedding.weight.grad.cpu().numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-10, atol=1e-12)


@needs_cuda_torch
def test_cuda_and_cpu_tensors_in_one_call_are_refused_naming_both():
    forest = rj.Forest.random_binary(1, seed=3, mean_leaves=3, vocab_size=VOCAB)
    params = dict(module().named_parameters())
    params["U_f"] = params["U_f"].detach().cuda()
    with pytest.raises(rj.InputError, match="on cpu and parameter 'U_f' on cuda"):
        rj.torch.apply(child_sum_tree_lstm, forest, params)
    with pytest.raises(rj.InputError, match="backend='cpu' computes on the host"):
        rj.torch.apply(child_sum_tree_lstm, forest,
                       {name: value.detach().cuda() for name, value in params.items()},
                       backend="cpu")
