"""recjit as a layer of a PyTorch model (`pip install recjit[torch]`; docs/torch.md).

`apply(model, forest, params)` runs a recursive model on tensors and returns a `Result` whose
`.roots` and `.nodes` are tuples of tensors, differentiable with respect to every tensor it
was given: an `autograd.Function` whose forward is `model.vjp` and whose backward is its
pullback (where nothing is to be differentiated, under `torch.no_grad()` or with no tensor
that requires grad, a plain `model.run`). `Module(model, **initial)` holds the parameters as
`nn.Parameter`s.

CPU tensors go in and come out without a copy (NumPy views of the same memory); with
`backend="cuda"` the forward and the backward compute on the GPU from them. CUDA tensors
(all of one device) compute on the GPU: the parameters, fields and context are read in place
through `__cuda_array_interface__`; the states come back as tensors on that device through
the host, and the dense parameters' gradients stay on the device where the compiled backward
sums them there (`pullback(device_output=True)`). A second derivative, which the pullback
does not have, is refused."""
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from .autodiff.gradients import RowGrad
from .errors import InputError, RecJitError
from .linearize import Forest
from .model import RecursiveModel
from .params import DeviceParams, Params, context_tuple, parameter_array


@dataclass(frozen=True)
class Result:
    """The states of every node (`nodes`, in the forest's order) and of the roots (`roots`,
    in the forest's root order): a tuple of tensors, one per state component."""

    nodes: tuple
    roots: tuple


@torch.compiler.disable
def apply(model, forest, params, fields=None, context=(), backend=None, sparse=()):
    """The model run on `forest` with these parameters, differentiably. Inside
    `torch.compile`, a graph break: the call runs eagerly, and Dynamo does not trace into
    recjit, whose compiling and kernels it could not follow.

    `params`: {name: tensor or Python number}, every parameter the cell reads. `fields`:
    {name: tensor} of float fields per node that replace the forest's (a tensor computed
    upstream, `nn.Embedding` → `node.x`, whose gradient flows back into that layer).
    `context`: the cell's arguments after `p`, tensors or numbers. `sparse`: the names of
    tables the cell only gathers rows from whose gradient is a sparse COO tensor (as
    `nn.Embedding(sparse=True)` gives), not a dense one. `backend`: "cpu" (None) or "cuda",
    where `model.vjp` computes: with CPU tensors, the CPU unless told; with CUDA tensors, the
    GPU."""
    _check_backend(backend)
    _check_model(model)
    _check_not_transformed()
    if not isinstance(forest, Forest):
        raise InputError(f"forest must be a recjit.Forest, not {type(forest).__name__}")
    if not isinstance(params, Mapping):
        raise InputError(f"params must be a dict {{name: tensor or number}}, not "
                         f"{type(params).__name__}")
    names = sorted(params)
    sparse = _checked_sparse(sparse, names)
    for name in sparse:
        _check_not_a_view(name, params[name])
        _keep_rows_coalesced(params[name])
    context = context_tuple(context)
    if fields is not None and not isinstance(fields, Mapping):
        raise InputError(f"fields must be a dict {{name: tensor}} of float fields a row a "
                         f"node, not {type(fields).__name__}")
    fields = dict(fields or {})
    inputs = ([("parameter", name, params[name]) for name in names]
              + [("field", name, fields[name]) for name in sorted(fields)]
              + [("context", str(position), value) for position, value in enumerate(context)])
    tensors = [value for _, _, value in inputs if isinstance(value, torch.Tensor)]
    device = _device_of(inputs, backend)
    layout = _Layout(model, forest, tuple(inputs), sparse,
                     "cuda" if device.type == "cuda" else backend or "cpu", device)
    if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors):
        outputs = _RecursiveFunction.apply(layout, *tensors)
    else:  # nothing to differentiate (torch.no_grad(), an evaluation): a run, no pullback
        outputs = layout.run(tensors)
    count = len(outputs) // 2
    return Result(nodes=tuple(outputs[:count]), roots=tuple(outputs[count:]))


def _check_model(model):
    if not isinstance(model, RecursiveModel):
        raise InputError("recjit.torch runs a recursive model (a cell decorated with "
                         f"@rj.recursive_model), not {type(model).__name__} {model!r}")


def _check_not_transformed():
    """torch.func's transforms hand the layer wrapped tensors with no memory to read: refuse
    them by name rather than let PyTorch fail inside the call."""
    if torch._C._are_functorch_transforms_active():
        raise RecJitError("recjit.torch differentiates through autograd (backward(), "
                          "torch.autograd.grad), not under torch.func's transforms (grad, "
                          "vmap, jacrev): for each tree's gradient, the pullback "
                          "of model.vjp takes per_tree=True; for a jacobian, call "
                          "model.jacobian (docs/training.md)")


def _check_backend(backend):
    if backend not in (None, "cpu", "cuda"):
        raise RecJitError(f"recjit.torch computes with backend='cpu' or backend='cuda', not "
                          f"backend={backend!r}")


_COALESCING = {}  # id: a weak reference, of each tensor `_keep_rows_coalesced` hooked


def _keep_rows_coalesced(tensor):
    """Once for a leaf tensor whose gradient recjit gives sparse: a hook after its gradient is
    accumulated (`_coalesced_rows`). The tensors are known by id while they live (a tensor
    compares elementwise, so no weak set holds them)."""
    if not isinstance(tensor, torch.Tensor) or not (tensor.is_leaf and tensor.requires_grad):
        return
    key = id(tensor)
    known = _COALESCING.get(key)
    if known is not None and known() is tensor:
        return
    tensor.register_post_accumulate_grad_hook(_coalesced_rows)
    _COALESCING[key] = weakref.ref(tensor, lambda _: _COALESCING.pop(key, None))


def _coalesced_rows(tensor):
    """Mark `tensor.grad` coalesced where it is: a sparse gradient of rows whose indices
    strictly increase, as the rows recjit gives are. PyTorch's gradient accumulation hands
    such a gradient on unmarked, and an optimizer then sorts it again: sparse Adagrad's
    `coalesce` took 0.13 ms of an SST training step (X=300, 287 rows)."""
    grad = tensor.grad
    if grad is None or not grad.is_sparse or grad.is_coalesced() or grad.sparse_dim() != 1:
        return
    rows = grad._indices()[0]
    if rows.numel() > 1 and not bool((rows[1:] > rows[:-1]).all()):
        return  # rows listed twice, or out of order: a sum with another sparse gradient
    tensor.grad = torch.sparse_coo_tensor(grad._indices(), grad._values(), grad.shape,
                                          is_coalesced=True, check_invariants=False)


def _checked_sparse(sparse, names):
    """`sparse` as a tuple of names among the parameters' `names`: one name may be given as
    a string."""
    sparse = (sparse,) if isinstance(sparse, str) else tuple(sparse)
    for name in sparse:
        if not isinstance(name, str):
            raise InputError(f"sparse takes the names of tables, not {name!r}")
        if name not in names:
            raise InputError(f"sparse names {name!r}, which is not among the parameters "
                             f"passed: {', '.join(names)}")
    return sparse


def _check_not_a_view(name, table):
    """Refuse a table named in `sparse` that is a differentiable view of another tensor (a
    slice, `.view`, `.t()`): PyTorch cannot send a sparse gradient back through a view's
    backward, and would fail inside `backward()`, far from the call (as
    `nn.Embedding(sparse=True)` over such a view does)."""
    if isinstance(table, torch.Tensor) and table.grad_fn is not None and table._is_view():
        raise InputError(f"sparse names {name!r}, a view of another tensor "
                         f"({type(table.grad_fn).__name__}): PyTorch cannot pass a sparse "
                         "gradient back through a view; pass the table itself, or leave "
                         f"{name!r} out of sparse for a dense gradient")


def _device_of(inputs, backend):
    """The one device of the tensors among `inputs` ((kind, name, value), ...): the CPU, or
    one CUDA device, which takes `backend` "cuda" or None; anything else, a tensor that is
    not dense (a sparse layout, which has no array interface) or one of floats other than
    float32 and float64 (bfloat16 has no NumPy dtype to refuse it by), is refused, naming a
    tensor."""
    placed = {}
    for kind, name, value in inputs:
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                raise InputError(f"{kind} {name!r} is a {value.layout} tensor; recjit.torch "
                                 "takes dense tensors (torch.strided): pass .to_dense()")
            if value.is_floating_point() and value.dtype not in (torch.float32, torch.float64):
                raise InputError(f"{kind} {name!r} holds {value.dtype}; recjit computes in "
                                 "torch.float32 or torch.float64")
            if value.device.type not in ("cpu", "cuda"):
                raise InputError(f"{kind} {name!r} is on {value.device}; recjit.torch takes "
                                 "CPU or CUDA tensors")
            placed.setdefault(value.device, f"{kind} {name!r}")
    if len(placed) > 1:
        (first, one), (second, other) = list(placed.items())[:2]
        raise InputError(f"{one} is on {first} and {other} on {second}; recjit.torch takes "
                         "the tensors of one call on one device")
    device = next(iter(placed), torch.device("cpu"))
    if device.type == "cuda" and backend == "cpu":
        raise InputError(f"{placed[device]} is on {device}, and backend='cpu' computes on the "
                         "host: leave backend out (CUDA tensors compute on the GPU), or move "
                         "the tensors with .cpu()")
    return device


@dataclass(frozen=True)
class _Layout:
    """What `_RecursiveFunction` needs besides the tensors: the model, the forest, every input
    as (kind, name, value) in order (a tensor's value is the tensor passed beside it), the
    tables whose gradient is sparse, the backend that computes, and the tensors' device, where
    the outputs and the gradients go."""

    model: object
    forest: Forest
    inputs: tuple
    sparse: tuple
    backend: str
    device: torch.device

    def arguments(self, tensors):
        """(Params, forest with its fields replaced, context) as NumPy views of `tensors`, or,
        for CUDA tensors, the tensors themselves (C-contiguous), which recjit reads through
        `__cuda_array_interface__` (`DeviceParams`, GPU fields)."""
        values = iter(tensors)
        params, fields, context = {}, {}, []
        on_gpu = self.device.type == "cuda"
        for kind, name, value in self.inputs:
            if isinstance(value, torch.Tensor):
                value = next(values).detach()
                value = value.contiguous() if on_gpu else value.numpy()
            if kind == "parameter":
                params[name] = value
            elif kind == "field":
                fields[name] = value
            else:
                context.append(value)
        forest = self.forest
        if fields:
            for name, value in fields.items():
                if value.shape[:1] != (forest.num_nodes,):
                    rows = (f"{value.shape[0]} row{'' if value.shape[0] == 1 else 's'}"
                            if value.ndim else "no rows (a scalar)")
                    raise InputError(f"field {name!r} has {rows}, where the forest has "
                                     f"{forest.num_nodes} nodes: a row a node")
            forest = Forest(forest.child_ptr, forest.child_idx, forest.roots,
                            {**forest.fields, **fields}, forest.kind)
        return (DeviceParams if on_gpu else Params)(**params), forest, tuple(context)

    def outputs(self, result):
        """The states of a `recjit.Result`, every node's then the roots', as tensors on the
        device."""
        return tuple(torch.from_numpy(np.ascontiguousarray(state)).to(self.device)
                     for state in result.nodes + result.roots)

    def run(self, tensors):
        """The states `model.run` gives for `tensors`: where nothing is differentiated, no
        products are kept and no parameters copied for a pullback."""
        params, forest, context = self.arguments(tensors)
        return self.outputs(self.model.run(forest, params, backend=self.backend,
                                           context=context))


class _RecursiveFunction(torch.autograd.Function):
    """forward: `model.vjp`'s result as tensors; backward: its pullback's gradients, each
    shaped and typed as the tensor it belongs to."""

    @staticmethod
    def forward(ctx, layout, *tensors):
        params, forest, context = layout.arguments(tensors)
        result, pullback = layout.model.vjp(forest, params, context=context,
                                            backend=layout.backend)
        ctx.layout, ctx.pullback = layout, pullback
        tensor_inputs = [(kind, name) for kind, name, value in layout.inputs
                         if isinstance(value, torch.Tensor)]
        ctx.versions = tuple((kind, name, tensor, tensor._version)
                             for (kind, name), tensor in zip(tensor_inputs, tensors))
        ctx.set_materialize_grads(False)
        return layout.outputs(result)

    @staticmethod
    def backward(ctx, *cotangents):
        if torch.is_grad_enabled():  # create_graph=True: this gradient is to be differentiated
            raise RecJitError("recjit's pullback has no derivative of its own: a second "
                              "derivative through recjit.torch (torch.autograd.grad or "
                              "backward with create_graph=True, a gradient penalty) is not "
                              "supported")
        _check_unchanged(ctx)
        count = len(cotangents) // 2
        as_arrays = [None if c is None else c.detach().cpu().numpy() for c in cotangents]
        nodes, roots = tuple(as_arrays[:count]), tuple(as_arrays[count:])
        single = count == 1 and not ctx.pullback.cell.state_is_tuple
        on_device = ctx.layout.device.type == "cuda" and ctx.pullback.gives_device_gradients
        gradients = ctx.pullback(roots=roots[0] if single else roots,
                                 nodes=nodes[0] if single else nodes, device_output=on_device)
        return (None,) + tuple(_gradients_of(ctx.layout, gradients))


def _check_unchanged(ctx):
    """Refuse a backward whose inputs changed in place since the forward (an optimizer's
    step first), as autograd refuses it for the tensors it saves: torch counts each
    tensor's in-place changes (`_version`), on the GPU too, fields and context included,
    which the pullback's own check of the parameters' values does not cover."""
    for kind, name, tensor, version in ctx.versions:
        if tensor._version != version:
            raise InputError(f"{kind} {name!r} changed in place after the forward: its "
                             f"gradient is at the forward's values, so run backward before "
                             f"updating it, or run the forward again")


def _gradients_of(layout, gradients):
    """The gradient of each tensor input, in order; None for one the cell does not read (a
    parameter or field it ignores, an integer field), which autograd takes as no gradient."""
    result = []
    for kind, name, value in layout.inputs:
        if not isinstance(value, torch.Tensor):
            continue
        if kind == "parameter":
            gradient = getattr(gradients.params, name, None)
        elif kind == "field":
            gradient = gradients.fields.get(name)
        else:
            gradient = gradients.context[int(name)]
        sparse = kind == "parameter" and name in layout.sparse
        if sparse and gradient is not None and not isinstance(gradient, RowGrad):
            raise InputError(f"sparse names {name!r}, whose gradient is dense: the cell does "
                             f"not only gather rows from it")
        result.append(None if gradient is None else _as_tensor(gradient, value, sparse))
    return result


def _as_tensor(gradient, like, sparse):
    if isinstance(gradient, RowGrad):
        if sparse:
            return torch.sparse_coo_tensor(  # the rows are unique and sorted: coalesced
                torch.from_numpy(gradient.indices)[None], torch.from_numpy(gradient.values),
                like.shape, dtype=like.dtype, device=like.device, is_coalesced=True,
                check_invariants=False)
        gradient = gradient.to_dense()
    if hasattr(gradient, "__cuda_array_interface__"):  # a device array, read in place
        gradient = torch.as_tensor(gradient, device=like.device)
    else:  # a host array, without a copy or a conversion it does not need
        gradient = torch.from_numpy(np.asarray(gradient))
    gradient = gradient.to(dtype=like.dtype, device=like.device)
    return gradient if gradient.shape == like.shape else gradient.reshape(like.shape)


class Module(torch.nn.Module):
    """A recursive model as an `nn.Module`: `Module(model, E=..., W=..., sparse=("E",))` holds
    a copy of each initial array as an `nn.Parameter` (so `state_dict`, `.double()`, optimizers and
    `DistributedDataParallel` see them); `forward(forest, fields=None, context=())` returns
    what `apply` returns, computed on `backend` ("cpu" or "cuda", given at construction)."""

    def __init__(self, model, sparse=(), backend=None, **initial):
        super().__init__()
        _check_backend(backend)
        _check_model(model)
        self.model = model
        self.sparse = _checked_sparse(sparse, sorted(initial))
        self.backend = backend
        for name, value in initial.items():
            array = parameter_array(name, value)
            if array.dtype.kind not in "fiu":
                raise InputError(f"initial parameter {name!r} holds {array.dtype}, not numbers")
            self.register_parameter(name, torch.nn.Parameter(torch.tensor(array)))

    def forward(self, forest, fields=None, context=()):
        return apply(self.model, forest, dict(self.named_parameters()), fields, context,
                     backend=self.backend, sparse=self.sparse)

    def extra_repr(self):
        """The model and each parameter's shape and dtype (`print(module)` shows what it
        holds, as `nn.Linear` shows its sizes), and the options that are not the default."""
        parameters = ", ".join(f"{name}={tuple(value.shape)}"
                               for name, value in self.named_parameters())
        dtypes = {str(value.dtype).removeprefix("torch.") for value in self.parameters()}
        options = [f"sparse={self.sparse!r}"] if self.sparse else []
        options += [f"backend={self.backend!r}"] if self.backend else []
        return ", ".join([f"model={self.model.__name__}", parameters, *sorted(dtypes),
                          *options])
