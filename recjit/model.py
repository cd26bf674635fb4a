"""`recursive_model` and what it returns: the plain recursion, plus `run`, `reference`,
`explain` and `kernel_source`."""
import ast
import functools
import importlib
import inspect
import io
import linecache
import os
import pickle
import threading
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import numba
import numba.cloudpickle
import numpy as np

from .autodiff import (Pullback, adjoint_case, copied_parameters, parameter_guards,
                       tree_of_nodes)
from .autodiff.jacobian import jacobian_by_copies
from .codegen_cpu import CpuBackward, CpuKernel
from .errors import (InputError, RecJitError, UnsupportedError, checked_flag, did_you_mean,
                     is_whole)
from .explanation import (Explanation, backward_line, outside_line, remat_line,
                          traffic_line)
from .frontend import Binding, build_cell_ir, check_properties, read_source, require_code
from .linearize import Forest, first_outside, linearize, one_node_per_batch, unroll_batches
from .lowering import (barriers_per_batch, check_schedule, choose_schedule, lower, lower_backward,
                       print_kernel, refactor_variants)
from .lowering.arguments import weight_shapes
from .ops import filling
from .params import (WithContext, check_as_array, context_tuple, described, is_weak,
                     params_on_host, pinned, shape_and_dtype, to_host)
from .reference import NodeView, memoised_state, run_reference
from .result import Result
from .schedule import Schedule, checked_schedule

BACKENDS = ("cpu", "cuda")


def checked_backend(backend):
    """`backend`, one of BACKENDS; anything else is refused."""
    if backend not in BACKENDS:
        raise RecJitError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if numba.config.DISABLE_JIT:
        raise RecJitError("recjit compiles its kernels with numba, and NUMBA_DISABLE_JIT=1 turns "
                          "numba's compiler off in this process: unset it to run the model, or "
                          "step through the cell in Python with model.reference(forest, p)")
    return backend


_DEFAULT_ARITY = object()


def recursive_model(function=None, *, arity=_DEFAULT_ARITY, kind="tree", schedule=None):
    """Decorate a recursive cell function `f(node, p)`; see docs/design.md §1. `arity`: the children
    of every internal node (2 by default, 1 for a sequence), or None for any number (child-sum
    models, DAGs whose nodes have different numbers of predecessors)."""
    if kind not in ("tree", "dag", "sequence"):
        raise RecJitError(f"kind must be 'tree', 'dag' or 'sequence', not {kind!r}")
    if arity is _DEFAULT_ARITY:
        arity = 1 if kind == "sequence" else 2
    if arity is not None and (not isinstance(arity, int) or isinstance(arity, bool)
                              or arity < 1):
        raise RecJitError(f"arity must be a positive int (children per internal node) or "
                          f"None (any number); got {arity!r}")
    if kind == "sequence" and arity != 1:
        raise RecJitError(f"a sequence model has one child per step (the previous step); "
                          f"arity={arity!r} does not fit kind='sequence'")

    schedule = checked_schedule(schedule, Schedule())

    def decorate(cell):
        require_code(cell)
        return RecursiveModel(cell, arity, kind, schedule)

    return decorate if function is None else decorate(function)


class Compiled:
    """Everything compiled for one input signature: cell IR, the schedule with the compiler's
    choices filled in, ILIR kernel, machine code."""

    def __init__(self, cell, schedule, kernel, backend_kernel):
        self.cell = cell
        self.schedule = schedule
        self.kernel = kernel
        self.backend_kernel = backend_kernel

    def for_forest(self, linearized):
        return self


class ByForest:
    """The kernels of one input signature whose schedule each forest completes: on the GPU,
    whether to refactor (`lowering.choose.RefactorTrade`). Each is compiled when a forest
    first asks for it. `schedule`: the fields every forest shares."""

    def __init__(self, cell, trade, schedule, compile_schedule):
        self.cell = cell
        self.schedule = schedule
        self.trade = trade
        self.compile_schedule = compile_schedule
        self.kernels = {}
        self.lock = threading.Lock()

    def for_forest(self, linearized):
        refactor = self.trade.pays_for(linearized)
        compiled = self.kernels.get(refactor)
        if compiled is None:
            with self.lock:
                compiled = self.kernels.get(refactor)
                if compiled is None:
                    compiled = self.compile_schedule(self.schedule.but(refactor=refactor))
                    self.kernels[refactor] = compiled
        return compiled


def _user_facing(method):
    """A public method whose `RecJitError`s show the user's frames only, ending at the call
    of the method (as JAX filters its own): the error already names the cell's line or the
    input at fault, and recjit's internal frames would bury it. `RECJIT_TRACEBACK=full`
    keeps them."""
    @functools.wraps(method)
    def user_facing(*arguments, **keywords):
        try:
            return method(*arguments, **keywords)
        except RecJitError as error:
            if os.environ.get("RECJIT_TRACEBACK") == "full":
                raise
            raise error.with_traceback(None) from None
    return user_facing


@dataclass(frozen=True, eq=False)
class Analysis:
    """The cell's source, what proving P.1–P.3 learnt of it (`frontend.properties.Usage`),
    and the parameters and fields it reads (sorted). Part of the compiled-kernel cache key,
    compared by identity: one per binding of the names the cell reads from outside."""

    source: object
    usage: object
    parameters: tuple
    fields: tuple


@dataclass(frozen=True)
class Prepared:
    """A forest validated, linearized and matched to its compiled kernel ahead of `run`
    (`RecursiveModel.prepare`); `key`: the signature it was prepared for."""

    model: object
    forest: Forest
    key: tuple
    compiled: object
    linearized: object
    inputs: tuple  # the kernel's arguments from the forest (`backend_kernel.inputs`)

    def __repr__(self):
        """Short: the model, the forest and the backend it is ready for (the compiled kernel
        and the arrays it holds are not for reading)."""
        return f"Prepared({self.model.__name__}, {self.forest!r}, backend={self.key[0]!r})"

    def __reduce__(self):
        raise RecJitError("a prepared forest cannot be pickled: it holds this process's "
                          "compiled kernel; send its forest (prepared.forest) and prepare it "
                          "in the process that runs it (a data loader's thread, not its "
                          "worker processes)")


class RecursiveModel:
    def __init__(self, function, arity, kind, schedule):
        functools.update_wrapper(self, function)
        self.function = function
        # the cell's own (a wrapper's, not what it wraps): context defaults, keywords
        self._arguments = inspect.signature(function, follow_wrapped=False)
        self.arity = arity
        self.kind = kind
        self.schedule = schedule
        self._analysed = None  # (the current `Analysis`, the `Binding` it was made for)
        self._analyses = {}  # (the outside names, a `Binding.key`) → its `Analysis`
        self._compiled = {}
        self._cells = {}  # (parameters, fields, analysis) of a `signature` → its cell IR
        # (a `signature`, the effects wanted) → (its cell IR, its adjoint case by name, the
        # backward kernel)
        self._adjoints = {}
        self._latest = {}
        self._latest_backward = {}  # {backend: the backward kernel compiled or used last}
        self._training_schedules = {}  # {schedule: `_training_schedule`'s}
        self._lock = threading.Lock()
        self.kernels_compiled = 0  # forward kernels this process compiled or loaded from disk

    def __call__(self, node, p, *context, **named):
        """The plain recursion (reference semantics) on a node view. `named`: context
        arguments by keyword (`cell(child, p, scale=scale)`)."""
        if isinstance(node, Forest):
            raise RecJitError(f"{self.__name__}(node, p) is the plain recursion on one node, as "
                              f"the cell calls itself; for a forest, call "
                              f"{self.__name__}.run(forest, p) (the compiled kernel) or "
                              f"{self.__name__}.reference(forest, p)")
        if named:
            bound = self._arguments.bind(node, p, *context, **named)
            bound.apply_defaults()
            context = bound.args[2:]
        if isinstance(node, NodeView):
            state = memoised_state(node.forest, node.index, p, context)
            if state is not None:
                return state
        return self.function(node, p, *context)

    def __repr__(self):
        return f"<recjit model {self.__name__} arity={self.arity} kind={self.kind!r}>"

    # copying and pickling ---------------------------------------------------------------
    def __copy__(self):
        """The model itself, as `copy` gives a function: its cell calls the model by name, so
        a copy would call the original, and its compiled kernels are shared anyway (a
        `Module` deep-copied as the best epoch's snapshot keeps this model)."""
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        """A model defined in a module pickles as a reference to it, which the other side
        imports. Any other (a notebook cell's, a script's, a function's local) pickles by
        value, whichever pickler asks (pickle, `torch.save`, cloudpickle): its cell function,
        the functions it calls, its options and their source, which the other side gives
        linecache so that the cell can be analysed there. Compiled kernels are not pickled:
        the other side compiles, or loads them from numba's disk cache."""
        reference = self._reference(main=False)
        if reference is not None:
            return _model_in_module, reference
        return pickle.loads, (_pickled_by_value(self),)

    def _reduce_for_processes(self):
        """multiprocessing's pickling (a process pool's, a queue's): a model at the top of a
        script is a reference to `__main__`, as pickle makes it for the script's functions,
        since the pool's processes run the same script (forked, or importing it again)."""
        reference = self._reference(main=True)
        if reference is not None:
            return _model_in_module, reference
        return self.__reduce__()

    def _reference(self, main):
        """(module, qualified name) under which importing finds this model, or None; `main`:
        `__main__` counts as a module."""
        module, name = getattr(self, "__module__", None), getattr(self, "__qualname__", "")
        if module is None or (module == "__main__" and not main) or "<locals>" in name:
            return None
        return (module, name) if _importable(module, name) is self else None

    def __getstate__(self):
        functions = _source_functions(self.function)
        return {"function": self.function, "arity": self.arity, "kind": self.kind,
                "schedule": self.schedule,
                "filenames": {name: function.__code__.co_filename
                              for name, function in functions.items()},
                "sources": {function.__code__.co_filename:
                            linecache.getlines(function.__code__.co_filename)
                            for function in functions.values()}}

    def __setstate__(self, state):
        for filename, lines in state["sources"].items():
            if lines and not linecache.getlines(filename):  # a notebook cell's, elsewhere
                linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
        function = state["function"]
        for name, filename in state["filenames"].items():
            _named_from(_source_functions(function).get(name), filename)
        self.__init__(function, state["arity"], state["kind"], state["schedule"])

    # compiling -------------------------------------------------------------------------
    def analyse(self):
        """Read the source and prove P.1–P.3: once per model, and again when a name the cell
        reads from outside its body (a constant, a helper) is bound to another object, as a
        notebook does when it runs a cell that defines it again. Bindings that compile the
        same kernel share one `Analysis`, and so their compiled kernels."""
        analysed = self._analysed
        if analysed is not None and analysed[1].holds(analysed[0].usage.outside.values()):
            return analysed[0]
        source = read_source(self.function)
        usage = check_properties(self, source)
        binding = Binding(usage.outside.values())
        analysis = self._analyses.setdefault(
            (usage.outside.names, binding.key),
            Analysis(source, usage, tuple(sorted(usage.parameters)), tuple(sorted(usage.fields))))
        self._analysed = (analysis, binding)
        return analysis

    @staticmethod
    def signature(analysis, forest, p, backend, schedule):
        """The compiled-kernel cache key: backend, schedule, the shapes and dtypes of the
        parameters and fields the cell reads, and its `analyse()` (which stands for what the
        names it reads from outside its body denote). Computed at every run, so kept lean."""
        parameters = []
        for name in analysis.parameters:
            value = getattr(p, name, None)
            if value is None:
                raise _missing(p, name, analysis.source)
            check_as_array(described(p, name), value)
            parameters.append((name, *shape_and_dtype(value)))
        fields = forest.fields
        for name in analysis.fields:
            check_as_array(f"field {name!r}", fields.get(name))
        return (backend, schedule, tuple(parameters),
                tuple((name, *_field_spec(fields[name], kind=True))
                      for name in analysis.fields if name in fields), analysis)

    def with_context(self, analysis, p, context):
        """`p` with the cell's context arguments (its arguments after `p`, in its
        `analyse()`) bound by name, as every compiling method takes them: a kernel reads them
        as parameters."""
        names = analysis.usage.context
        context = context_tuple(context)
        if isinstance(p, WithContext) and not context:
            return p  # bound already, by the method that called this one
        context = self.with_defaults(names, context)
        if len(context) != len(names):
            wanted = ", ".join(names) if names else "none"
            raise InputError(f"{self.__name__} takes {len(names)} context argument(s) after "
                             f"the parameters ({wanted}); context= gave {len(context)}")
        return WithContext(p, dict(zip(names, context))) if names else p

    def with_defaults(self, names, context):
        """`context` followed by the defaults of the context arguments it leaves out
        (`def cell(node, p, scale=2.0)`), as a plain call of the cell takes them."""
        if len(context) >= len(names):
            return context
        defaults = tuple(self._arguments.parameters[name].default
                         for name in names[len(context):])
        missing = any(default is inspect.Parameter.empty for default in defaults)
        return context if missing else context + defaults

    @_user_facing
    def compile(self, forest, p, backend="cpu", schedule=None, context=()):
        """The compiled kernel for this forest's fields and these parameters' shapes (and,
        where the schedule depends on it, for this forest); the same shapes hit the in-memory
        cache, and numba's disk cache across processes."""
        analysis = self.analyse()
        return self._compiled_for(analysis, forest, self.with_context(analysis, p, context),
                                  backend, schedule)[2]

    def _compiled_for(self, analysis, forest, p, backend, schedule):
        """(the signature, its entry, the forest's compiled kernel, the linearized forest)."""
        key, entry = self._compiled_entry(analysis, forest, p, backend, schedule)
        linearized = self.linearize(forest, entry.schedule)
        compiled = entry.for_forest(linearized)
        self._latest[backend] = compiled
        return key, entry, compiled, linearized

    def _compiled_entry(self, analysis, forest, p, backend, schedule):
        """(the signature, its `Compiled`, or its `ByForest` where each forest completes the
        schedule)."""
        checked_backend(backend)
        _require_forest(forest)
        schedule = checked_schedule(schedule, self.schedule)
        key = self.signature(analysis, forest, p, backend, schedule)
        entry = self._compiled.get(key)
        if entry is None or not entry.cell.outside.holds():
            with self._lock:
                entry = self._compiled.get(key)
                if entry is None or not entry.cell.outside.holds():
                    cell = self._cell_for(analysis, forest, p, key)
                    schedule = check_schedule(schedule, self.kind)
                    barriers = None
                    if schedule.refactor is None:  # lower both ways, the backend counts
                        barriers = backend_barriers(backend, refactor_variants(cell, schedule),
                                                    schedule, key[2])
                    chosen, trade = choose_schedule(cell, schedule, backend, self.arity,
                                                    barriers)

                    def compile_schedule(chosen):
                        self.kernels_compiled += 1
                        kernel = lower(cell, chosen)
                        fast_math = chosen.fast_math and cell.dtype == "float32"
                        return Compiled(cell, chosen, kernel, backend_kernel(
                            backend, kernel, fast_math, chosen, key[2]))

                    entry = (ByForest(cell, trade, chosen, compile_schedule)
                             if chosen.refactor is None
                             else compile_schedule(chosen))
                    self._compiled[key] = entry
        return key, entry

    def _cell_for(self, analysis, forest, p, key=None):
        """The cell IR for these parameters' shapes and this forest's fields; `key`: their
        `signature` where the caller has it, of which the backend and schedule do not matter
        here."""
        if key is None:
            key = self.signature(analysis, forest, p, None, None)
        key = (key[2], key[3], key[4])
        cell = self._cells.get(key)
        if cell is None or not cell.outside.holds():  # built before a value it read changed
            field_specs = {name: _field_spec(values) for name, values in forest.fields.items()}
            cell = build_cell_ir(self, analysis.source, p, field_specs, self.arity)
            self._cells[key] = cell
        return cell

    # running ---------------------------------------------------------------------------
    @_user_facing
    def linearize(self, forest, schedule=None):
        """Validate the forest against the model's structure and linearize it into the
        batches `schedule` runs."""
        _require_forest(forest)
        schedule = checked_schedule(schedule, None)
        linearized = linearize(forest, single_parent=self.kind != "dag", arity=self.arity)
        if schedule is None or linearized.num_nodes == 0:
            return linearized
        if schedule.unroll > 1:
            return unroll_batches(linearized, schedule.unroll, schedule.dynamic_batching)
        if not schedule.dynamic_batching:
            return one_node_per_batch(linearized)
        return linearized

    @staticmethod
    def check_gathers(cell, linearized):
        """Every gathered field index lies inside its table, on the nodes that read it. The
        cell was built for the tables' shapes (they are part of its signature)."""
        for case, table, field in cell.gathers:
            rows = cell.parameters[table][0]
            begin, end = ((linearized.leaf_begin, linearized.num_nodes) if case == "leaf"
                          else (0, linearized.leaf_begin))
            values = linearized.fields[field][begin:end]
            bad = first_outside(values, rows)
            if bad >= 0:
                node = int(linearized.old_of_new[begin + bad])
                raise InputError(f"node {node}: field {field!r} = {values[bad]} is "
                                 f"outside the {rows} rows of parameter {table!r}")

    @_user_facing
    def prepare(self, forest, p, backend="cpu", schedule=None, context=()):
        """Everything `run` does before its kernel, done now: the forest validated and
        linearized, its gathered indices checked, its kernel compiled for these parameters'
        shapes. `run(prepared, p, ...)` with the same backend, schedule and shapes then goes
        straight to the kernel: a data loader can prepare the next forest while the kernel
        runs this one."""
        analysis = self.analyse()
        p = self.with_context(analysis, p, context)
        forest, key, compiled, linearized = self._checked(analysis, forest, p, backend, schedule)
        inputs = compiled.backend_kernel.inputs(linearized) if linearized.num_nodes else None
        return Prepared(self, forest, key, compiled, linearized, inputs)

    @_user_facing
    def run(self, forest, p, backend="cpu", schedule=None, check_finite=False,
            device_output=False, context=()):
        """Evaluate every node of the forest (a `Forest`, or one `prepare` made ready) with
        the compiled kernel. `check_finite`: refuse NaN or infinite parameters and float
        fields first (an O(size) scan, off by default). `device_output` (backend="cuda"): the
        result's arrays stay on the GPU. `context`: the values of the cell's arguments after
        `p`, in order."""
        check_finite = checked_flag("check_finite", check_finite)
        if checked_flag("device_output", device_output) and backend != "cuda":
            raise RecJitError(f"device_output=True asks for GPU arrays; backend={backend!r} "
                              "computes on the host")
        analysis = self.analyse()
        p = self.with_context(analysis, p, context)
        if backend != "cuda":
            p = params_on_host(p, analysis.parameters)  # the CPU kernel reads host memory
        if isinstance(forest, Prepared):
            compiled, linearized = self._prepared(analysis, forest, p, backend, schedule)
            forest, inputs = forest.forest, forest.inputs
        else:
            forest, _, compiled, linearized = self._checked(analysis, forest, p, backend,
                                                            schedule)
            inputs = None
        if linearized.num_nodes == 0:
            return self._empty_result(compiled.cell)
        if check_finite:
            check_finite_inputs(compiled.cell, forest, p)
        return compiled.backend_kernel.run(
            linearized, p, compiled.cell.state_shapes,
            inputs or compiled.backend_kernel.inputs(linearized), device_output)

    def _checked(self, analysis, forest, p, backend, schedule):
        """(the forest, its GPU fields copied to the host for a CPU run; the signature; its
        compiled kernel; its linearization, the gathered indices checked)."""
        if backend != "cuda" and isinstance(forest, Forest):
            forest = forest.on_host()  # the CPU kernel reads host memory
        key, _, compiled, linearized = self._compiled_for(analysis, forest, p, backend, schedule)
        if linearized.num_nodes:
            self.check_gathers(compiled.cell, linearized)
        return forest, key, compiled, linearized

    def _prepared(self, analysis, prepared, p, backend, schedule):
        """(the compiled kernel, the linearized forest) of a `Prepared` forest, if it was
        prepared by this model for this backend, schedule and these parameters' shapes."""
        if prepared.model is not self:
            raise InputError(f"this forest was prepared by {prepared.model.__name__}, not "
                             f"{self.__name__}")
        if self.signature(analysis, prepared.forest, p, backend,
                          checked_schedule(schedule, self.schedule)) != prepared.key:
            raise InputError(f"this forest was prepared for another backend, schedule or "
                             f"parameter shapes than backend={backend!r} and these; call "
                             f"{self.__name__}.prepare again")
        outside = prepared.compiled.cell.outside
        if not outside.holds():
            raise InputError(f"`{outside.changed()}`, which {self.__name__} reads from outside "
                             "its body, has changed since this forest was prepared; call "
                             f"{self.__name__}.prepare again")
        self._latest[backend] = prepared.compiled
        return prepared.compiled, prepared.linearized

    @_user_facing
    def vjp(self, forest, p, backend="cpu", schedule=None, context=()):
        """(the `Result` that `run` gives, its `Pullback`): `pullback(roots=..., nodes=...)`
        returns the `Gradients` of the states weighted by those cotangents, with respect to
        every parameter, gathered row, float field and context argument (docs/training.md).
        The forward pass is the compiled kernel's; the backward, the adjoint of the cell IR
        lowered to a kernel of its own that walks the batches roots first (on the CPU, or
        with `backend="cuda"` one cooperative launch on the GPU; `kernel_source(backend,
        grad=True)` prints it), or, where its lowering does not take a construct, evaluated
        with NumPy a batch at a time."""
        checked_backend(backend)
        return self._vjp(forest, p, schedule, context, backend=backend)

    def _vjp(self, forest, p, schedule, context, wanted=None, backend="cpu"):
        """`vjp`, its backward kernel computing only the `wanted` effects ((effect, parameter
        or field) pairs; None: every one)."""
        analysis = self.analyse()
        p = self.with_context(analysis, p, context)
        if backend == "cpu":
            p = params_on_host(p, analysis.parameters)
        forest, key, compiled, linearized = self._checked(
            analysis, forest, p, backend, self._training_schedule(schedule))
        cell = compiled.cell
        copied = copied_parameters(cell, p)
        p = pinned(p, cell.parameters, copied)
        _, adjoints, backward = self._backward(key, compiled, wanted)
        kept = {}
        if linearized.num_nodes:
            states = compiled.backend_kernel(linearized, p,
                                             compiled.backend_kernel.inputs(linearized), kept)
            result = Result.from_linearized(states, cell.state_shapes, linearized.new_of_old,
                                            linearized.roots)
            forward = linearized
            linearized, states = self._height_batched(forest, linearized, states)
            if linearized is not forward:  # states the GPU kept are in the forward's order
                for name, _ in compiled.kernel.states:
                    kept.pop(name, None)
        else:
            states, result = [], self._empty_result(cell)
        return result, Pullback(cell, adjoints, linearized, states, p,
                                analysis.usage.context, backward, kept,
                                parameter_guards(cell, p, linearized.fields, copied,
                                                 device_guard(backend), backward))

    def _training_schedule(self, schedule):
        """The schedule `vjp` runs the forward with: `schedule` (or the model's), its products
        kept for the backward (`remat=False`) unless it says `remat=True` or where it needs
        them recomputed (refactored, unrolled), on the CPU and on the GPU alike. A
        jacobian's (`wanted` effects) copies the kept products with the states
        (`kept_for_copies`). Found once a schedule: every vjp asks, and each new `Schedule`
        validates every field."""
        schedule = checked_schedule(schedule, self.schedule)
        training = self._training_schedules.get(schedule)
        if training is None:
            training = schedule
            if schedule.remat is False or (schedule.remat is None and not (
                    schedule.refactor or schedule.unroll > 1)):
                training = schedule.but(remat=False, refactor=bool(schedule.refactor))
            self._training_schedules[schedule] = training
        return training

    def _backward(self, key, compiled, wanted=None):
        """(the cell, its adjoint case by name, the compiled backward kernel or None) for a
        signature's compiled forward, computing the `wanted` effects (None: all). Without a
        kernel (a construct its lowering does not take), the adjoint is interpreted."""
        cell = compiled.cell
        entry = self._adjoints.get((key, wanted))
        if entry is None or entry[0] is not cell:
            adjoints = {case.name: adjoint_case(case, cell.filename) for case in cell.cases}
            backward = None
            try:
                kernel = lower_backward(cell, adjoints, compiled.schedule.row_block, wanted,
                                        shared_children=self.kind == "dag",
                                        kept=compiled.kernel.kept,
                                        distinct_key=compiled.kernel.distinct_key,
                                        gradient_columns=key[0] != "cpu")
            except UnsupportedError:
                kernel = None  # a construct the backward lowering does not take yet
            if kernel is not None:
                backward = backward_kernel(key, kernel, compiled.schedule, cell.dtype)
            entry = (cell, adjoints, backward)
            self._adjoints[(key, wanted)] = entry
        if entry[2] is not None and wanted is None:  # what kernel_source(grad=True) shows
            self._latest_backward[key[0]] = entry[2]
        return entry

    def _height_batched(self, forest, linearized, states):
        """(the forest batched by height, the states in its numbering): the backward needs
        every parent in an earlier batch than its children, which an unrolled schedule's
        batches of several heights break."""
        if linearized.batch_item is None:
            return linearized, states
        by_height = self.linearize(forest)
        order = linearized.new_of_old[by_height.old_of_new]
        return by_height, [state[order] for state in states]

    @_user_facing
    def jacobian(self, forest, p, wrt, output=0, context=(), backend="cpu"):
        """`J[n]` = ∂ (state component `output` of node n's root) / ∂ (node n's float field
        `wrt`, or the row of parameter table `wrt` that node n gathers), for every node n in
        the forest's order: shape (num_nodes, *state, *field or row). One backward pass for
        all the state's elements at once: the forest taken once per element, each copy's
        roots given that element's unit cotangent (pfor's vectorized jacobian); on the CPU,
        or with `backend="cuda"` the GPU's forward and backward kernels."""
        checked_backend(backend)
        if not isinstance(wrt, str):
            raise InputError(f"wrt must be the name of one float field or gathered table, a "
                             f"string, not {type(wrt).__name__} {wrt!r}: a jacobian is taken "
                             f"with respect to one at a time")
        analysis = self.analyse()
        bound = self.with_context(analysis, p, context)
        cell = self._cell_for(analysis, forest, bound)
        if not is_whole(output) or not 0 <= output < len(cell.state_shapes):
            raise InputError(f"output must be a state component, 0 to "
                             f"{len(cell.state_shapes) - 1}, not {output!r}")
        output = int(output)
        by_case = {}
        for case, table, field in cell.gathers:
            if table == wrt:
                by_case.setdefault(case, set()).add(field)
        for case, fields in sorted(by_case.items()):
            if len(fields) > 1:
                raise InputError(f"wrt={wrt!r}: the cell's {case} case gathers a row of {wrt} "
                                 f"by each of fields {sorted(fields)}, and a jacobian's one row "
                                 f"a node would add the derivatives of different rows together; "
                                 f"to take the jacobian of one, give each field a table of its "
                                 f"own")
        gathered = bool(by_case)
        if not gathered and not (wrt in cell.fields
                                 and np.dtype(cell.fields[wrt][1]).kind == "f"):
            raise InputError(f"wrt must name a float field the cell reads or a table it "
                             f"gathers rows from, not {wrt!r}; the cell reads fields "
                             f"{sorted(cell.fields)} and gathers from "
                             f"{sorted({table for _, table, _ in cell.gathers})}")
        tree_of_nodes(self.linearize(forest))  # a node of two roots has no one root
        wanted = frozenset({("grad_table" if gathered else "grad_field", wrt)})
        pullback = self._vjp(forest, p, None, context, wanted, backend)[1]
        return jacobian_by_copies(pullback, forest, output, wrt, gathered, self.linearize)

    @_user_facing
    def reference(self, forest, p, context=()):
        """The naive recursion's result, in the same `Result` form as `run`, after the checks
        `run` makes: the cell, the forest's structure, the parameters' shapes and every
        gathered index (so a negative word is refused, not read from the table's end)."""
        _require_forest(forest)
        forest = forest.on_host()
        analysis = self.analyse()
        context = self.with_defaults(analysis.usage.context, context_tuple(context))
        bound = self.with_context(analysis, p, context)  # refuses a wrong count, as `run` does
        cell = self._cell_for(analysis, forest, bound)
        linearized = self.linearize(forest)
        if linearized.num_nodes == 0:
            return self._empty_result(cell)
        self.check_gathers(cell, linearized)
        p = params_on_host(p, analysis.parameters)  # the recursion is NumPy's
        context = tuple(to_host(value) for value in context)
        with filling(_parameters_dtype(bound, analysis.parameters)):
            states = run_reference(self, forest, p, context)
        first = next(iter(states.values()))
        is_tuple = isinstance(first, tuple)
        components = len(first) if is_tuple else 1
        nodes = tuple(np.stack([np.asarray(states[n][c] if is_tuple else states[n])
                                for n in range(forest.num_nodes)]) for c in range(components))
        return Result.from_nodes(nodes, forest.roots)

    @staticmethod
    def _empty_result(cell):
        nodes = tuple(np.zeros((0,) + shape, dtype=cell.dtype) for shape in cell.state_shapes)
        return Result(nodes=nodes, roots=nodes)

    def _backward_source(self, backend, forest, p, context):
        checked_backend(backend)
        if forest is not None and p is not None:
            analysis = self.analyse()
            key, _, compiled, _ = self._compiled_for(
                analysis, forest, self.with_context(analysis, p, context), backend,
                self._training_schedule(None))
            backward = self._backward(key, compiled)[2]
        else:
            backward = self._latest_backward.get(backend)
        if backward is None:
            raise RecJitError(f"no backward kernel has been compiled for {self.__name__}: "
                              + ("its backward is interpreted" if forest is not None else
                                 "call vjp(), or pass forest and p"))
        return backward.source

    # reading what was generated ---------------------------------------------------------
    @_user_facing
    def explain(self, forest, p, backend="cpu", schedule=None, file=None, context=(),
                grad=False):
        """The cell IR, the linearized forest and the ILIR kernel, as an `Explanation` (a str
        a notebook or the REPL shows once; `print()` it in a script, or pass `file` to write it
        there); with `grad=True`, the adjoint of each case too, and the backward kernel's ILIR,
        which `vjp`'s pullback runs on `backend`."""
        grad = checked_flag("grad", grad)
        if file is not None and not callable(getattr(file, "write", None)):
            raise InputError(f"explain writes to `file`, an open text file (or None: it "
                             f"returns the text), not {type(file).__name__}")
        analysis = self.analyse()
        p = self.with_context(analysis, p, context)
        if grad:  # what vjp runs: the forward that keeps its products, where it does
            schedule = self._training_schedule(schedule)
        key, entry, compiled, linearized = self._compiled_for(analysis, forest, p, backend,
                                                              schedule)
        sizes = np.diff(linearized.batch_begin)
        text = "\n".join([
            f"== {self.__name__}: cell IR (one op list per structural case) ==",
            str(compiled.cell), "",
            "== forest ==",
            f"{linearized}",
            f"internal batches run from the leaves up: {sizes[:-1][::-1].tolist()}",
            "", f"== ILIR ({backend}) ==", print_kernel(compiled.backend_kernel.planned), "",
            f"schedule: {compiled.schedule}"
            + (" (refactor chosen for this forest)" if isinstance(entry, ByForest) else ""),
            f"barriers per batch: {barriers_per_batch(compiled.kernel)}",
            traffic_line(compiled, p, sizes[:-1]),
            f"launch: {compiled.backend_kernel.describe()}",
            outside_line(analysis),
        ] + ([] if not grad else self._explain_backward(key, compiled, backend)))
        if file is not None:
            print(text, file=file)
        return Explanation(text)

    def _explain_backward(self, key, compiled, backend):
        """`explain(grad=True)`'s lines: each case's adjoint and the backward's ILIR, as the
        backend plans it."""
        _, adjoints, backward = self._backward(key, compiled)
        return (["", ("== adjoint (vjp's backward: each case's ops recomputed from the "
                      "children's states, then these, a batch at a time, roots first) ==")]
                + [str(adjoint) for adjoint in adjoints.values()]
                + ([] if backward is None else
                   ["", f"== backward ILIR ({backend}) ==", print_kernel(backward.planned)])
                + [remat_line(compiled.kernel.kept), backward_line(backward, backend)])

    @_user_facing
    def kernel_source(self, backend="cpu", forest=None, p=None, context=(), grad=False):
        """The generated source of the kernel compiled last for `backend` (or for this forest
        and these parameters, when given); `grad=True`: of the backward kernel compiled last
        (by `vjp`, `explain(grad=True)` or this; or of one for this forest and these
        parameters)."""
        if checked_flag("grad", grad):
            return self._backward_source(backend, forest, p, context)
        if forest is not None and p is not None:
            return self.compile(forest, p, backend, context=context).backend_kernel.source
        if backend not in BACKENDS:
            raise RecJitError(f"kernel_source(backend, forest, p): backend must be one of "
                              f"{BACKENDS}, not {backend!r}")
        if backend not in self._latest:
            raise RecJitError(f"no {backend} kernel has been compiled yet for "
                              f"{self.__name__}; call run(), or pass forest and p")
        return self._latest[backend].backend_kernel.source


def _source_functions(cell):
    """{"": the cell function, name: each plain function its globals name (a helper, the
    model itself)}: the functions whose source analysing the cell reads."""
    functions = {"": cell}
    for name in require_code(cell).co_names:
        value = cell.__globals__.get(name)
        value = getattr(value, "function", value) if isinstance(value, RecursiveModel) else value
        if inspect.isfunction(value):
            functions[name] = value
    return functions


def _named_from(function, filename):
    """`function` with its code's file named `filename` again: cloudpickle names the code of a
    function it pickled by value `<dynamic-code>`, where inspect finds no source."""
    if function is not None and function.__code__.co_filename != filename:
        function.__code__ = function.__code__.replace(co_filename=filename)


def _importable(module, qualname):
    """The object at `module.qualname`, or None where there is none."""
    try:
        value = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
        return value
    except (ImportError, AttributeError):
        return None


def _model_in_module(module, qualname):
    return _importable(module, qualname)


ForkingPickler.register(RecursiveModel, RecursiveModel._reduce_for_processes)


def _unpickled_model():
    """An empty model for `__setstate__` to fill: pickle records it before its state, so a
    cell that calls itself (its function's globals hold the model) refers back to it."""
    return RecursiveModel.__new__(RecursiveModel)


class _ByValuePickler(numba.cloudpickle.Pickler):
    """numba's copy of cloudpickle (which numba pickles its own jitted functions with),
    taking each model that importing cannot find as its state: the cell function and what it
    calls by value, the model itself once, so that the cell's call to it refers back."""

    def reducer_override(self, value):
        if isinstance(value, RecursiveModel) and value._reference(main=False) is None:
            return _unpickled_model, (), value.__getstate__()
        return super().reducer_override(value)


def _pickled_by_value(model):
    buffer = io.BytesIO()
    _ByValuePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(model)
    return buffer.getvalue()


def backend_kernel(backend, kernel, fast_math, schedule, parameters):
    """The backend's compiled form of an ILIR kernel; `parameters`: (name, shape, dtype)."""
    if backend == "cpu":
        return CpuKernel(kernel, fast_math, schedule.pack_from_nodes)
    from .codegen_cuda import CudaKernel  # numba.cuda is imported only when asked for
    return CudaKernel(kernel, fast_math, schedule, _weight_shapes(parameters))


def backward_kernel(key, kernel, schedule, dtype):
    """The compiled form of a backward ILIR kernel on the backend of the forward's signature
    `key`."""
    backend, _, parameters = key[:3]
    fast_math = schedule.fast_math and dtype == "float32"
    if backend == "cpu":
        return CpuBackward(kernel, fast_math, schedule.pack_from_nodes, schedule.row_block)
    from .codegen_cuda.backward import CudaBackward
    return CudaBackward(kernel, fast_math, schedule, _weight_shapes(parameters))


def device_guard(backend):
    """What keeps a vjp's GPU parameters on the device for its pullback to compare
    (`parameter_guards`): None on the CPU, where every parameter is on the host."""
    if backend == "cpu":
        return None
    from .codegen_cuda.snapshot import DeviceValues
    return DeviceValues


def backend_barriers(backend, variants, schedule, parameters):
    """{refactor: how many barriers an internal batch of that lowered variant crosses as the
    backend runs it}, for the refactoring choice: on the CPU, every one the lowering placed
    (None: the chooser counts them); on the GPU, those at which the whole grid meets in the
    planned kernel (`codegen_cuda.grid_barriers`)."""
    if backend == "cpu":
        return None
    from .codegen_cuda import grid_barriers
    weight_shapes = _weight_shapes(parameters)
    return {refactored: grid_barriers(kernel, schedule, weight_shapes)
            for refactored, kernel in variants.items()}


def _missing(p, name, source=None):
    """The error for parameter `name`, which the cell reads (where `source` shows) and `p`
    lacks, with the name `p` has that is closest to it."""
    where = _first_read(source, name)
    given = sorted(vars(p)) if hasattr(p, "__dict__") and not isinstance(p, dict) else []
    return InputError(f"{described(p, name)} is missing from the parameters"
                      + (f" (read at {where})" if where else "")
                      + did_you_mean(name, given)
                      + (" (a cell reads them as attributes, p.name, and a dict's items are "
                         "not: pass rj.Params(**p))" if isinstance(p, dict) else ""))


def _first_read(source, name):
    """`file:line` of the cell's first `<something>.name`, or None."""
    if source is None:
        return None
    reads = [node for node in ast.walk(source.tree)
             if isinstance(node, ast.Attribute) and node.attr == name]
    if not reads:
        return None
    first = min(reads, key=lambda node: node.lineno)
    return f"{source.filename}:{source.lineno(first)}"


def _parameters_dtype(p, names):
    """The one dtype of the parameters `names` (those the cell reads, its context included),
    else None."""
    values = [getattr(p, name, None) for name in names]
    dtypes = {shape_and_dtype(value)[1] for value in values
              if value is not None and not is_weak(value)}
    return dtypes.pop() if len(dtypes) == 1 else None


def _weight_shapes(parameters):
    return weight_shapes({name: shape for name, shape, _ in parameters})


def _require_forest(forest):
    if isinstance(forest, Prepared):
        raise InputError("a forest that prepare() made ready is for run() alone: pass the "
                         "forest itself here (prepared.forest)")
    if not isinstance(forest, Forest):
        raise InputError(f"expected a recjit.Forest, got {type(forest).__name__}"
                         + _FOREST_FROM.get(type(forest), ""))


_FOREST_FROM = {  # how a forest is made from what is passed instead of one
    list: " (nested tuples make one with rj.Forest.from_nested(trees))",
    tuple: " (nested tuples make one with rj.Forest.from_nested(trees))",
    str: " (PTB text makes one with rj.Forest.from_ptb(text))",
}


def _field_spec(values, kind=False):
    """(the shape of a node's value, the dtype or with `kind` its kind) of a host or GPU
    field."""
    shape, dtype = ((values.shape, values.dtype) if isinstance(values, np.ndarray)
                    else shape_and_dtype(values))
    return tuple(shape[1:]), dtype.kind if kind else dtype


def check_finite_inputs(cell, forest, p):
    """Name the first parameter or float field holding a NaN or an infinity, and where."""
    arrays = [(described(p, name), getattr(p, name)) for name in sorted(cell.parameters)]
    arrays += [(f"field {name!r}", forest.fields[name]) for name in sorted(cell.fields)
               if _field_spec(forest.fields[name])[1].kind == "f"]
    for what, values in arrays:
        values = np.asarray(to_host(values))
        bad = np.argwhere(~np.isfinite(values))
        if bad.size:
            index = tuple(int(i) for i in bad[0])
            where = f"node {index[0]}, " if what.startswith("field") else ""
            raise InputError(f"{what} holds {values[index]} at {where}index {index}; "
                             "check_finite=True refuses NaN and infinite inputs")
