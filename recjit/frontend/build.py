"""From the cell function's AST to the cell IR, one structural case at a time.

The function is executed abstractly with the case fixed (a leaf, or an internal node with k
children): `node.is_leaf` and `node.num_children` are then known constants, so every branch and
every loop over the children resolves statically, and only tensor operations remain. Shapes come
from the actual parameters and fields, so a shape error names the user's line."""
import ast
import builtins
import sys
from collections import Counter

import numpy as np

from .. import ops
from ..errors import InputError, ShapeError, UnsupportedError, did_you_mean
from ..params import described, is_weak, shape_and_dtype
from .cell_ir import EACH, OVER_CHILDREN, CellCase, CellIR, Op, attribute, label, transposed
from .names import UNRESOLVED, Captured, Item, OutsideName, is_immutable, is_user_helper
from .interpret import CellInterpreter
from .syntax import is_none_test, positional_arguments

MAX_UNROLLED = 4096  # the most steps of a loop the frontend unrolls
BINARY_OPERATORS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
PYTHON_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                    ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
                    ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
                    ast.Pow: lambda a, b: a ** b}
MAX_POWER = 8  # `x ** k`: the largest |k|, as k - 1 products
COMPARISONS = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
               ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
               ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}


class Tensor:
    """A value of the case being built."""

    def __init__(self, index, shape):
        self.index = index
        self.shape = shape


class NodeView:
    def __init__(self, child=None):
        self.child = child  # None: the node itself; k: its k-th child; EACH: any one child


class VariableCount:
    """`node.num_children` of an internal node when the arity is variable: of its comparisons
    only those with 0 are known; as a tensor, it is a number per node (op `num_children`)."""


class ChildLocal:
    """A name bound inside a loop over a variable number of children to a per-child value:
    it has no single value after the loop. `updated_at`: the lines where the loop changes a
    value it had before other than by one sum or running maximum or minimum a child (a
    product, say, or two updates), else None."""

    def __init__(self, name, updated_at=None):
        self.name = name
        self.updated_at = updated_at


class PerChild:
    """With a variable arity, one value per child: a generator or list comprehension over
    `node.children` (or over another `PerChild`), or `zip` of such. It is summed
    (`sum(...)`), looped over in a loop that accumulates, or mapped to another `PerChild`;
    `value` is what it is at any one child (`EACH`)."""

    def __init__(self, value):
        self.value = value


# What a cell may do with node.children, and with a value per child, when their number varies.
VARIABLE_CHILDREN = ("the number of children is known at run time only: node.children and a "
                     "value per child are summed (`sum(...)`), mapped (`[f(c, p) for c in "
                     "node.children]`, `zip(node.children, states)`, `enumerate(...)`) or "
                     "looped over in a loop that accumulates (`acc = acc + ...`, `acc = "
                     "rj.maximum(acc, ...)`), not indexed")


class ChildrenView:
    pass


class ParamsView:
    pass


class ParamArray:
    """A parameter as the cell reads it: its shape and dtype, never its values (a device
    array stays on the device)."""

    def __init__(self, name, shape, dtype):
        self.name = name
        self.shape = shape
        self.dtype = dtype


class NodeField:
    """An integer per-node field (`node.word`): usable as a gather index."""

    def __init__(self, name):
        self.name = name


class _Return(Exception):
    def __init__(self, value, node):
        self.value = value
        self.node = node  # the `return` statement


class CaseBuilder:
    """Builds one structural case by abstract execution of the function's statements."""

    def __init__(self, model, params, field_specs, num_children, state, outside):
        self.model = model
        self.outside = outside  # what the cases read from outside the cell (`Captured`)
        self.params = params
        self.context = ()  # the ParamArray bound to each context argument, in order
        self.field_specs = field_specs
        self.num_children = num_children
        self.state = state  # (shapes, is_tuple) of the leaf case, for recursive calls
        self.ops = []
        self.memo = {}
        self.gathers = set()

    # values ----------------------------------------------------------------------------
    def emit(self, kind, args, attrs, shape, line):
        simplified = self.simplify(kind, args, attrs, tuple(shape), line)
        if simplified is not None:
            return simplified
        key = (kind, args, attrs, tuple(shape))
        if key not in self.memo:
            per_child = (kind == "child_state" and attrs[0] == EACH
                         or kind == "child_position") or (
                kind not in OVER_CHILDREN and any(self.ops[a].per_child for a in args))
            self.memo[key] = len(self.ops)
            self.ops.append(Op(kind, args, attrs, tuple(shape), line, per_child))
        index = self.memo[key]
        return Tensor(index, self.ops[index].shape)

    def is_zero(self, index):
        op = self.ops[index]
        return op.kind in ("const", "fill") and op.attrs[0] == 0.0

    def simplify(self, kind, args, attrs, shape, line):
        """Zeros propagate (docs/design.md §4): a leaf's empty child sum, `0 + x`, `W @ 0` cost
        nothing. Returns the value that replaces the op, or None."""
        zeros = [self.is_zero(a) for a in args]
        if not any(zeros):
            return None
        if kind in ("matvec", "matmul", "inner", "child_sum") or (
                kind == "binary" and attrs[0] == "mul") or (kind == "binary" and all(zeros)):
            return self.emit("fill" if shape else "const", (), (0.0,), shape, line)
        if kind == "binary" and attrs[0] in ("add", "sub"):
            other = args[1] if zeros[0] else args[0]
            if self.ops[other].shape == shape and (attrs[0] == "add" or zeros[1]):
                return Tensor(other, shape)
        return None

    def parameter(self, name, source, node):
        """Parameter `name` (an attribute of the parameters, or a context argument)."""
        array = getattr(self.params, name, None)
        if array is None:
            raise InputError(f"{described(self.params, name)} is missing from the parameters "
                             f"(read at {source.filename}:{source.lineno(node)})")
        shape, dtype = shape_and_dtype(array)
        if dtype not in (np.float32, np.float64) and not is_weak(array):
            native = (f" in the machine's byte order (`.astype(np.{dtype.name})`)"
                      if dtype.kind == "f" and not dtype.isnative else "")
            raise InputError(f"{described(self.params, name)} has dtype {dtype}; parameters "
                             f"must be float32 or float64 arrays{native}")
        return ParamArray(name, shape, dtype)

    def transposed(self, value, source, node):
        """`value.T`: a number or a vector as it is (as NumPy's), a parameter matrix read
        transposed where it lies (the kernel's view `pT_W` of `p_W`); the transpose of a
        computed matrix would be a copy per node, which the language leaves out."""
        shape = value.shape
        if len(shape) < 2:
            return value
        if isinstance(value, Tensor) and self.ops[value.index].kind != "param":
            raise UnsupportedError(f"`.T` of a computed matrix (shape {shape}); only a "
                                   "parameter matrix can be read transposed",
                                   **source.where(node))
        name = value.name if isinstance(value, ParamArray) else self.ops[value.index].attrs[0]
        if len(shape) > 2:
            raise ShapeError(f"`.T` of parameter {attribute(name)!r}, of shape {shape}: a "
                             "parameter is transposed as a matrix, of 2 dimensions",
                             **source.where(node))
        if isinstance(value, Tensor):
            return self.emit("param", (), (transposed(name),), shape[::-1], source.lineno(node))
        return ParamArray(transposed(name), shape[::-1], value.dtype)  # an op once it is used

    def tensor(self, value, source, node):
        if isinstance(value, Tensor):
            return value
        if isinstance(value, ParamArray):
            return self.emit("param", (), (value.name,), value.shape, source.lineno(node))
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            if isinstance(value, int) and abs(value) > sys.float_info.max:  # of any size
                raise UnsupportedError(f"constant {value} is beyond the largest float",
                                       **source.where(node))
            return self.emit("const", (), (float(value),), (), source.lineno(node))
        if isinstance(value, VariableCount):  # a number per node: its count of children
            return self.emit("num_children", (), (), (), source.lineno(node))
        if isinstance(value, NodeField):
            raise UnsupportedError(f"field {value.name!r} holds integer indices: it gathers a "
                                   f"parameter's row (`p.E[node.{value.name}]`), not a value to "
                                   "compute with (a float field is one, as node.x or node.dt)",
                                   **source.where(node))
        if isinstance(value, np.ndarray):
            raise UnsupportedError(f"an array of shape {value.shape} from outside the cell "
                                   "cannot be used as a tensor: pass it as a parameter (p.name)",
                                   **source.where(node))
        raise UnsupportedError(f"{_describe(value)} cannot be used as a tensor here",
                               **source.where(node))

    # running the function --------------------------------------------------------------
    def call(self, source, env, depth=0):
        return self.run(source, env, depth).value

    def run(self, source, env, depth=0):
        """The `_Return` of running `source` (the cell, or a helper it calls) in `env`: the
        value returned, and the statement that returned it."""
        interpreter = Interpreter(self, source, depth)
        try:
            interpreter.run_body(source.tree.body, env)
        except _Return as returned:
            return returned
        raise UnsupportedError(f"the cell function returns nothing for a "
                               f"{self.case_name} node", filename=source.filename,
                               lineno=source.lineno(source.tree))

    @property
    def variable_arity(self):
        return self.num_children is None

    @property
    def case_name(self):
        if self.num_children is None:
            return "internal"
        return "leaf" if self.num_children == 0 else f"{self.num_children}-child"


class Interpreter(CellInterpreter):
    """The cell's statements run over cell IR values (`Tensor`s, views, numbers), one
    structural case at a time: each `if` takes the branch the case decides, each loop over
    the children runs once per child, or once at a symbolic child where their number varies."""

    def __init__(self, builder, source, depth):
        super().__init__(builder.model, source, depth)
        self.builder = builder
        self.owned = set()  # names whose array the plain recursion made for them alone

    def shape_error(self, message, node):
        return ShapeError(message, **self.source.where(node))

    # statements ------------------------------------------------------------------------
    def returned(self, value, node):
        raise _Return(value, node)

    def statement(self, node, env):
        self.owned -= self.escaping_in(node, env)
        return super().statement(node, env)

    def stmt_Assign(self, node, env):
        super().stmt_Assign(node, env)
        self.note_owners(node.targets, node.value, env)

    def stmt_AnnAssign(self, node, env):
        if node.value is None:
            self.other_statement(node, env)
        super().stmt_AnnAssign(node, env)
        self.note_owners([node.target], node.value, env)

    def stmt_AugAssign(self, node, env):
        current = self.expr(node.target, env)
        self.refuse_shared_update(node, current)
        value = self.binary(node.op, current, self.expr(node.value, env), node)
        self.bind(node.target, value, env)
        self.owned.add(node.target.id)

    def stmt_If(self, node, env):
        self.run_body(node.body if self.concrete_bool(node.test, env) else node.orelse, env)

    def stmt_For(self, node, env):
        iterable = self.expr(node.iter, env)
        each = self.each_child(iterable)
        if each is not None:
            self.child_loop(node, each, env)
            return
        for element in self.sequence(iterable, node.iter):
            self.bind(node.target, element, env)
            self.owned -= _names(node.target)
            self.run_body(node.body, env)
        self.run_body(node.orelse, env)

    # `x += y` updates x's array in place in the plain recursion, and the kernel computes a
    # new value: the two agree only where no other name, child state, parameter, field,
    # container or view shares that array. A name owns its array from an assignment of a new
    # array until the first read that may let the array out (`escaping`): anything but an
    # operand of an operation that makes a new array and keeps no reference to its operands.
    def note_owners(self, targets, value, env):
        """After `targets = value`: the names that now hold an array of their own."""
        if len(targets) > 1:  # `a = b = x * 2`: one array, two names
            self.owned -= set().union(*(_names(t) for t in targets))
            return
        pairs = [(targets[0], value)]
        while pairs:
            target, expression = pairs.pop()
            if isinstance(target, ast.Name) and self.allocates(expression, env):
                self.owned.add(target.id)
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(
                    expression, (ast.Tuple, ast.List)) and len(target.elts) == len(
                    expression.elts):
                pairs.extend(zip(target.elts, expression.elts))
            else:
                self.owned -= _names(target)

    def allocates(self, expression, env):
        """Whether NumPy makes a new array for `expression` (an operator, an elementwise
        function, a product, rj.zeros, rj.ones, rj.concat, sum without a start), not a view or
        a value held elsewhere (`sum((), a)` is `a` itself)."""
        if isinstance(expression, (ast.BinOp, ast.UnaryOp)):
            return True
        if isinstance(expression, ast.Call):
            function = self.called(expression, env)
            if function is builtins.sum:
                return len(expression.args) == 1 and not expression.keywords
            return any(function is allocating for allocating in _ALLOCATING_FUNCTIONS)
        return False

    def called(self, call, env):
        """The function a call calls, as the cell language knows it."""
        return ops.as_cell_function(self.expr(call.func, env))

    def escaping_in(self, statement, env):
        """The names whose arrays `statement` may let out: into another name, a container, a
        view, a helper's arguments, a loop's target."""
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            return self.escaping(statement.value, env)
        if isinstance(statement, ast.AugAssign):  # `a += b` reads b into a's array
            return self.escaping(statement.value, env, consumed=True)
        if isinstance(statement, ast.If):
            return self.escaping(statement.test, env, consumed=True)
        if isinstance(statement, ast.For):
            return self.escaping(statement.iter, env)
        if isinstance(statement, ast.Expr):
            return self.escaping(statement.value, env)
        return set()

    def escaping(self, expression, env, consumed=False):
        """The names whose arrays the value of `expression` may hold, or what it calls may
        keep. `consumed`: the value is an operand of an operation that makes a new array and
        keeps no reference to it, so a name read there lets nothing out."""
        parts = []  # (subexpression, consumed)
        if isinstance(expression, ast.Name):
            return set() if consumed else {expression.id}
        if isinstance(expression, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp)):
            parts = [(child, True) for child in ast.iter_child_nodes(expression)
                     if isinstance(child, ast.expr)]
        elif isinstance(expression, ast.Call):
            arguments = expression.args + [keyword.value for keyword in expression.keywords]
            function = self.called(expression, env)
            if function is builtins.sum:  # the start may be returned as it is
                parts = [(arguments[0], True)] + [(a, consumed) for a in arguments[1:]]
            else:
                reads = self.allocates(expression, env) or function in (builtins.len,
                                                                       builtins.range)
                parts = [(a, reads) for a in arguments]
        elif isinstance(expression, ast.Attribute):
            parts = [(expression.value, consumed or expression.attr == "shape")]
        elif isinstance(expression, ast.Subscript):
            parts = [(expression.value, consumed), (expression.slice, True)]
        elif isinstance(expression, (ast.Tuple, ast.List, ast.Starred)):
            elements = expression.elts if not isinstance(expression, ast.Starred) else [
                expression.value]
            parts = [(element, consumed) for element in elements]
        elif isinstance(expression, ast.IfExp):
            parts = [(expression.test, True), (expression.body, consumed),
                     (expression.orelse, consumed)]
        elif isinstance(expression, (ast.ListComp, ast.GeneratorExp)):
            parts = [(expression.elt, consumed)] + [
                (part, False) for generator in expression.generators
                for part in (generator.iter, *generator.ifs)]
        else:
            parts = [(child, False) for child in ast.iter_child_nodes(expression)
                     if isinstance(child, ast.expr)]
        return set().union(*(self.escaping(part, env, reads) for part, reads in parts))

    def refuse_shared_update(self, node, current):
        """`bind` refuses targets other than names (`p.W += ...`, `h[0] += ...`)."""
        name = getattr(node.target, "id", None)
        if isinstance(current, Tensor) and name is not None and name not in self.owned:
            symbol = _OPERATOR_SYMBOLS.get(type(node.op), "op")
            raise self.unsupported(
                f"`{name} {symbol}= ...` changes {name}'s array in place in the plain "
                f"recursion, where that array may be a child's state, a parameter or a field, "
                f"or be shared with another name, a list, a view or a helper's arguments; write "
                f"`{name} = {name} {symbol} ...`", node)

    def unpacked(self, value, target):
        """The values a tuple of names takes: as many as it has names (`left, right =
        node.children` with a fixed arity)."""
        if any(isinstance(element, ast.Starred) for element in target.elts):
            raise self.unsupported("only names and tuples of names can be assigned", target)
        if isinstance(value, ChildrenView):
            value = self.sequence(value, target)
        if not isinstance(value, (tuple, list)) or len(value) != len(target.elts):
            raise self.unsupported(f"cannot unpack {_describe(value)} into "
                                   f"{len(target.elts)} names", target)
        return value

    def concrete_bool(self, test, env):
        value = self.expr(test, env)
        if isinstance(value, ChildrenView):  # `if node.children:`, as a list is true
            return self.has_children()
        if isinstance(value, (bool, int, np.bool_)):
            return bool(value)
        raise self.unsupported("a condition must be decided by the node's structure "
                               "(node.is_leaf, node.num_children); branching on a field "
                               "value is not compiled", test)

    def each_child(self, iterable):
        """What a loop over `iterable` takes at any one child, where it goes over the children
        of a node whose number of children is not fixed (`node.children`, a `PerChild`);
        else None."""
        if not self.builder.variable_arity:
            return None
        if isinstance(iterable, ChildrenView):
            return NodeView(EACH)
        return iterable.value if isinstance(iterable, PerChild) else None

    def child_loop(self, loop, each, env):
        """`for c in node.children:` (or over a `PerChild`, as `for h in states:`) with a
        variable arity. The body runs once, its target bound to `each`, the value at a
        symbolic child; a name it updates as `acc = acc + x` becomes `acc + child_sum(x)`
        (and `best = rj.maximum(best, x)` `maximum(best, child_max(x))`), and a value
        computed per child cannot be read after the loop."""
        before = dict(env)
        self.bind(loop.target, each, env)
        try:
            self.run_body(loop.body, env)
        except _Return:
            raise self.unsupported("a `return` inside a loop over node.children is not "
                                   "compiled with arity=None; accumulate, then return",
                                   loop) from None
        ops = self.builder.ops
        updated = accumulators(loop.body)
        for name, value in list(env.items()):
            old = before.get(name)
            if value is old:
                continue
            if isinstance(value, NodeView) or (isinstance(value, Tensor)
                                               and ops[value.index].per_child):
                total = (self.accumulated(old, value, updated[name], loop)
                         if name in updated else None)
                env[name] = total if total is not None else ChildLocal(
                    name, None if old is None else self.assignment_lines(loop, name))
            elif isinstance(value, Tensor) and name in before:
                raise self.unsupported(f"`{name}` changes in the loop over node.children by "
                                       "a value that is the same for every child", loop)
        self.run_body(loop.orelse, env)

    def assignment_lines(self, loop, name):
        """The lines of the assignments to `name` in `loop`'s body, in order."""
        lines = {self.source.lineno(node) for node in ast.walk(loop)
                 if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                 and any(name in _names(target) for target in
                         (node.targets if isinstance(node, ast.Assign) else [node.target]))}
        return tuple(sorted(lines)) or (self.source.lineno(loop),)

    def accumulated(self, old, value, how, loop):
        """What a name updated in the loop (`accumulators`) holds after it: `old +
        child_sum(x)` where the body computed `value = old + x`; `maximum(old, child_max(x))`
        where it computed `value = maximum(old, x)`, and so for `minimum` and `maximum(x,
        old)`; else None."""
        if old is None or not isinstance(value, Tensor):
            return None
        builder = self.builder
        op = builder.ops[value.index]
        old = builder.tensor(old, self.source, loop)
        if how == "sum" and builder.is_zero(old.index):  # `0 + x` was simplified to x
            return self.sum_over_children(value, old, loop)
        if how == "sum":
            terms = self.terms_added_to(value.index, old.index)
            if not terms:
                return None
            term = terms[0]
            for other in terms[1:]:
                term = self.binary(ast.Add(), term, other, loop)
            return self.sum_over_children(term, old, loop)
        if op.kind != "binary" or old.index not in op.args or op.args[0] == op.args[1]:
            return None
        running_first = op.args[0] == old.index
        term = op.args[1] if running_first else op.args[0]
        term = Tensor(term, builder.ops[term].shape)
        if how == "call" and op.attrs in (("maximum",), ("minimum",)) \
                and old.shape in ((), term.shape):
            return self.extreme_over_children(op.attrs[0], term, old, running_first, loop)
        return None

    def terms_added_to(self, value, start):
        """The terms that `value`, a sum, adds to `start`, as tensors: the other operands of
        the additions on the way down to it (`start + a + b`: a and b; `start + (a + b)`:
        `a + b` as it is); None where `start` is not one of its terms."""
        ops = self.builder.ops
        op = ops[value]
        if value == start or op.kind != "binary" or op.attrs != ("add",):
            return [] if value == start else None
        for side, other in ((0, op.args[1]), (1, op.args[0])):
            inner = self.terms_added_to(op.args[side], start)
            if inner is not None:
                return inner + [Tensor(other, ops[other].shape)]
        return None

    def sum_over_children(self, term, start, node):
        """`start + Σ_children term`; the sum alone when `start` is None."""
        total = self.builder.emit("child_sum", (term.index,), (), term.shape,
                                  self.source.lineno(node))
        return total if start is None else self.binary(ast.Add(), start, total, node)

    def extreme_over_children(self, function, term, start, running_first, loop):
        """`maximum(start, child_max(term))` for a loop that updates `best = maximum(best,
        term)`, and so for `minimum`. NumPy's maximum gives the same bits however a chain of
        it is grouped, as long as a tie goes to the same side throughout: where the running
        value is the first operand, the start and then the earlier children win a tie
        (`earliest`), else the later children and then the start (`latest`)."""
        line = self.source.lineno(loop)
        extreme = self.builder.emit(_OVER_CHILDREN_BY[function], (term.index,),
                                    ("earliest" if running_first else "latest",),
                                    term.shape, line)
        operands = (start, extreme) if running_first else (extreme, start)
        return self.builder.emit("binary", tuple(o.index for o in operands), (function,),
                                 term.shape, line)

    def iterate(self, node, env):
        return self.sequence(self.expr(node, env), node)

    def sequence(self, value, node):
        """The values a loop (or `zip`, `enumerate`) over `value` takes, known now."""
        if isinstance(value, ChildrenView):
            if self.builder.variable_arity:
                raise self.unsupported(f"with arity=None, {VARIABLE_CHILDREN}", node)
            return [NodeView(k) for k in range(self.builder.num_children)]
        if isinstance(value, (tuple, list, range)):
            if len(value) > MAX_UNROLLED:
                raise self.unsupported(f"a loop over {len(value)} values: the frontend unrolls "
                                       f"loops, up to {MAX_UNROLLED} steps (a loop over a "
                                       "tensor's elements is what a vector operation does)",
                                       node)
            path = self.builder.outside.path_of(value)
            if path is not None:  # compared as a whole at each run; reads into it are paths
                for index, element in enumerate(value):
                    self.builder.outside.register(path.child(Item(index)), element)
            return list(value)
        if isinstance(value, PerChild):
            raise self.unsupported(f"{_describe(value)}: with arity=None, {VARIABLE_CHILDREN}",
                                   node)
        raise self.unsupported(f"cannot loop over {_describe(value)}", node)

    # expressions -----------------------------------------------------------------------
    def expr_Constant(self, node, env):
        if isinstance(node.value, (bool, int, float)) or node.value is None:
            return node.value
        raise self.unsupported(f"constant {node.value!r} is not a number", node)

    def expr_Name(self, node, env):
        if node.id in env:
            return env[node.id]
        path = OutsideName(self.source.function, (node.id,))
        value = path.value()
        if value is UNRESOLVED:
            raise self.unsupported(f"name {node.id!r} is not defined", node)
        return self.builder.outside.read(path, value)

    def expr_Tuple(self, node, env):
        return tuple(self.expr(element, env) for element in node.elts)

    def expr_List(self, node, env):
        return [self.expr(element, env) for element in node.elts]

    def expr_Attribute(self, node, env):
        base = self.expr(node.value, env)
        builder = self.builder
        if isinstance(base, NodeView):
            return self.node_attribute(base, node, env)
        if isinstance(base, ParamsView):
            return builder.parameter(node.attr, self.source, node)
        if isinstance(base, (Tensor, ParamArray)) and node.attr == "shape":
            return tuple(base.shape)
        if isinstance(base, (Tensor, ParamArray)) and node.attr == "T":
            return builder.transposed(base, self.source, node)
        if isinstance(base, (Tensor, ParamArray)):
            instead = _TENSOR_METHODS_INSTEAD.get(node.attr)
            raise self.unsupported(f"tensor attribute `.{node.attr}` is not part of the cell "
                                   "language" + (f": {instead}" if instead else ""), node)
        value = getattr(base, node.attr, UNRESOLVED)
        if value is UNRESOLVED:
            raise self.unsupported(f"{_describe(base)} has no attribute {node.attr!r}", node)
        path = builder.outside.path_of(base)
        if path is not None:
            return builder.outside.read(path.child(node.attr), value)
        if not is_immutable(base):
            raise self.unsupported(
                f"`.{node.attr}` of {_describe(base)}, which the cell did not read by a path "
                "from outside its body: a kernel is compiled for the values it reads, and a run "
                "checks them by the paths they were read by (`CONFIG.scale`, "
                "`CONFIGS[0].scale`, `self.scale` in a method called as `obj.method(...)`); "
                "read it by such a path, or pass it as a parameter or context argument", node)
        return value

    def node_attribute(self, view, node, env):
        num_children = self.builder.num_children
        if view.child is not None:
            raise self.unsupported("a cell may read its own node's fields, not a child's; "
                                   "pass what the parent needs through the child's state", node)
        if node.attr == "is_leaf":
            return num_children == 0
        if node.attr == "num_children":
            return VariableCount() if num_children is None else num_children
        if node.attr in ("left", "right") and num_children is None:
            raise self.unsupported(f"node.{node.attr} needs a fixed arity; with arity=None, "
                                   "sum over node.children", node)
        if node.attr in ("left", "right"):
            child = 0 if node.attr == "left" else 1
            if child >= num_children:
                raise self.unsupported(f"node.{node.attr} on a node with {num_children} "
                                       f"children (is the {self.builder.case_name} case "
                                       f"handled before it?)", node)
            return NodeView(child)
        if node.attr == "children":
            return ChildrenView()
        spec = self.builder.field_specs.get(node.attr)
        if spec is None:
            raise InputError(f"the forest has no field {node.attr!r} (read at "
                             f"{self.source.filename}:{self.source.lineno(node)}); its fields "
                             f"are {sorted(self.builder.field_specs)}")
        shape, dtype = spec
        if shape == () and np.dtype(dtype).kind in "iu":  # an index: `p.E[node.word]`
            return NodeField(node.attr)
        if shape == () and np.dtype(dtype).kind != "f":
            raise self.unsupported(f"scalar field {node.attr!r} holds {np.dtype(dtype)}; a "
                                   "scalar field holds integer indices or float numbers", node)
        if np.dtype(dtype).kind not in "biuf":
            raise InputError(f"vector field {node.attr!r} holds {np.dtype(dtype)} (read at "
                             f"{self.source.filename}:{self.source.lineno(node)}); a vector "
                             "field holds numbers, computed on in the parameters' dtype")
        return self.builder.emit("field", (), (node.attr,), shape, self.source.lineno(node))

    def expr_Subscript(self, node, env):
        base = self.expr(node.value, env)
        if isinstance(node.slice, ast.Tuple) and isinstance(base, ParamArray):
            raise self.unsupported(f"`{ast.unparse(node)}`: a parameter's row is gathered by "
                                   f"one index, `{ast.unparse(node.value)}[node.word]`, the whole "
                                   "row; indexing by several is not part of the cell language",
                                   node)
        if isinstance(node.slice, ast.Slice):
            return self.slice(base, node, env)
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            if isinstance(base, (ParamsView, NodeView)):
                what = "parameters" if isinstance(base, ParamsView) else "a node's fields"
                raise self.unsupported(f"{what} are read as attributes: write "
                                       f"`{ast.unparse(node.value)}.{node.slice.value}`, not "
                                       f"`{ast.unparse(node)}`", node)
            index = node.slice.value  # a key (`CONFIG["scale"]`), not a value computed with
        else:
            index = self.expr(node.slice, env)
        if isinstance(base, (ChildrenView, PerChild)) and self.builder.variable_arity:
            raise self.unsupported(f"indexing {_describe(base)} needs a fixed arity; with "
                                   f"arity=None, {VARIABLE_CHILDREN}", node)
        if isinstance(base, ChildrenView):
            count = self.builder.num_children
            if not isinstance(index, int) or not -count <= index < count:
                raise self.unsupported(f"node.children[{index!r}] on a node with {count} "
                                       "children", node)
            return NodeView(index % count)
        if isinstance(base, ParamArray) and isinstance(index, Tensor) and index.shape == () \
                and self.builder.ops[index.index].kind == "field":
            field = self.builder.ops[index.index].attrs[0]
            raise self.unsupported(f"scalar field {field!r} holds floats; a row of parameter "
                                   f"{base.name!r} is gathered by a field of integer indices",
                                   node)
        if isinstance(base, ParamArray) and isinstance(index, NodeField):
            if base.name != attribute(base.name):
                raise self.unsupported(f"a row of `p.{base.name}` is a column of parameter "
                                       f"{attribute(base.name)!r}; gather from a table stored "
                                       "with a row per index", node)
            if len(base.shape) == 0:
                raise self.shape_error(f"parameter {base.name!r} is a scalar; it cannot be "
                                       "indexed by a field", node)
            self.builder.gathers.add((base.name, index.name))
            return self.builder.emit("gather", (), (base.name, index.name),
                                     base.shape[1:], self.source.lineno(node))
        if isinstance(base, (tuple, list)) and isinstance(index, int):
            if not -len(base) <= index < len(base):
                raise self.unsupported(f"index {index} of {_describe(base)}", node)
            return self.item(base, index)
        if isinstance(base, dict) and isinstance(index, (str, int, float, bool)):
            if index not in base:
                raise self.unsupported(f"`{ast.unparse(node.value)}` has no key {index!r}"
                                       + did_you_mean(str(index), [str(k) for k in base]),
                                       node)
            return self.item(base, index)
        raise self.unsupported(f"indexing {_describe(base)} by {_describe(index)} is not "
                               "part of the cell language (gather a parameter row by a node "
                               "field, or slice a vector)", node)

    def item(self, container, key):
        """`container[key]`, of a list, tuple or dict from outside the cell: the container is
        compared as a whole at each run, and a read further into the item is a path."""
        path = self.builder.outside.path_of(container)
        if path is not None:
            self.builder.outside.register(path.child(Item(key)), container[key])
        return container[key]

    def slice(self, base, node, env):
        if isinstance(base, PerChild):
            raise self.unsupported(f"a list of values per child is sliced: with arity=None, "
                                   f"{VARIABLE_CHILDREN}", node)
        if isinstance(base, (ChildrenView, tuple, list)):
            bounds = [None if b is None else self.expr(b, env)
                      for b in (node.slice.lower, node.slice.upper, node.slice.step)]
            if not all(b is None or isinstance(b, int) for b in bounds) or bounds[2] == 0:
                what = "node.children" if isinstance(base, ChildrenView) else _describe(base)
                raise self.unsupported(f"{what} is sliced with constant bounds and a step "
                                       "other than 0", node)
            if isinstance(base, ChildrenView):  # `node.children[::-1]`, with a fixed arity
                return self.sequence(base, node)[slice(*bounds)]
            kept = range(len(base))[slice(*bounds)]  # `p.E.shape[1:]`, `LAYERS[:2]`
            return type(base)(self.item(base, index) for index in kept)
        tensor = self.builder.tensor(base, self.source, node)
        bounds = node.slice
        start = 0 if bounds.lower is None else self.expr(bounds.lower, env)
        stop = tensor.shape[0] if tensor.shape and bounds.upper is None else (
            None if bounds.upper is None else self.expr(bounds.upper, env))
        if bounds.step is not None or len(tensor.shape) != 1 or not (
                isinstance(start, int) and isinstance(stop, int)):
            raise self.unsupported("only vectors can be sliced, with constant bounds and no "
                                   "step", node)
        length = tensor.shape[0]
        start, stop, _ = slice(start, stop).indices(length)
        if stop <= start:
            raise self.shape_error(f"the slice is empty for a vector of length {length}", node)
        return self.builder.emit("slice", (tensor.index,), (start, stop), (stop - start,),
                                 self.source.lineno(node))

    def expr_BinOp(self, node, env):
        return self.binary(node.op, self.expr(node.left, env), self.expr(node.right, env), node)

    def binary(self, operator, left, right, node):
        if _is_number(left) and _is_number(right) and type(operator) in PYTHON_OPERATORS:
            try:
                return PYTHON_OPERATORS[type(operator)](left, right)
            except ArithmeticError as error:  # as the plain recursion would raise it
                raise self.unsupported(f"{type(error).__name__} ({error}) in arithmetic on "
                                       "numbers", node) from None
        line = self.source.lineno(node)
        if isinstance(operator, ast.MatMult):
            return self.matmul(left, right, node)
        if isinstance(operator, ast.Pow):
            return self.power(left, right, node)
        if type(operator) not in BINARY_OPERATORS:
            raise self.unsupported(f"operator `{type(operator).__name__}` is not part of the "
                                   "cell language", node)
        return self.elementwise("binary", BINARY_OPERATORS[type(operator)], left, right, node,
                                line)

    def power(self, base, exponent, node):
        """`x ** k` for a constant integer k: x · x · … (NumPy computes x ** 2 as x · x too),
        one over that for k < 0, ones for k = 0."""
        whole = isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and (
            float(exponent).is_integer())
        if not whole or abs(exponent) > MAX_POWER:
            raise self.unsupported(f"`**` takes a constant integer exponent from -{MAX_POWER} "
                                   f"to {MAX_POWER}, not {_describe(exponent)} (write rj.sqrt(x), "
                                   "or rj.exp(k * rj.log(x)) for others)", node)
        tensor = self.builder.tensor(base, self.source, node)
        if exponent == 0:
            return self.builder.emit("fill" if tensor.shape else "const", (), (1.0,),
                                     tensor.shape, self.source.lineno(node))
        result = tensor
        for _ in range(int(abs(exponent)) - 1):
            result = self.binary(ast.Mult(), result, tensor, node)
        return self.binary(ast.Div(), 1.0, result, node) if exponent < 0 else result

    def elementwise(self, kind, function, left, right, node, line):
        left = self.builder.tensor(left, self.source, node)
        right = self.builder.tensor(right, self.source, node)
        if left.shape != right.shape and left.shape != () and right.shape != ():
            product = function == "mul" and len(left.shape) == 2 and len(right.shape) == 1 \
                and left.shape[1] == right.shape[0]
            raise self.shape_error(f"shapes {left.shape} and {right.shape} do not match in "
                                   f"`{function}`" + (" (`*` is elementwise; the matrix "
                                                      "product is `@`)" if product else ""),
                                   node)
        shape = left.shape if left.shape != () else right.shape
        return self.builder.emit(kind, (left.index, right.index), (function,), shape, line)

    def matmul(self, left, right, node):
        left = self.builder.tensor(left, self.source, node)
        line = self.source.lineno(node)
        if len(left.shape) == 1 and len(getattr(right, "shape", ())) == 2:
            return self.vector_matmul(left, right, node)
        right = self.builder.tensor(right, self.source, node)
        if len(left.shape) == 1 and len(right.shape) == 1:  # a number
            if left.shape != right.shape:
                raise self.shape_error(f"the inner product of shapes {left.shape} and "
                                       f"{right.shape}: lengths differ", node)
            return self.builder.emit("inner", (left.index, right.index), (), (), line)
        if len(left.shape) != 2 or len(right.shape) not in (1, 2):
            raise self.shape_error(f"`@` needs a matrix on the left and a vector or matrix on "
                                   f"the right, not shapes {left.shape} and {right.shape}", node)
        if left.shape[1] != right.shape[0]:
            raise self.shape_error(f"`@` of shapes {left.shape} and {right.shape}: inner "
                                   "dimensions differ", node)
        if len(right.shape) == 1:
            return self.builder.emit("matvec", (left.index, right.index), (),
                                     (left.shape[0],), line)
        return self.builder.emit("matmul", (left.index, right.index), (),
                                 (left.shape[0], right.shape[1]), line)

    def vector_matmul(self, vector, matrix, node):
        """`h @ W` is `W.T @ h`: a product with the parameter read transposed."""
        if vector.shape[0] != matrix.shape[0]:
            raise self.shape_error(f"`@` of shapes {vector.shape} and {matrix.shape}: inner "
                                   "dimensions differ", node)
        if isinstance(matrix, Tensor) and self.builder.ops[matrix.index].kind != "param":
            raise self.unsupported(f"a vector @ a computed matrix (shapes {vector.shape} and "
                                   f"{matrix.shape}): the matrix would be read transposed, "
                                   "which only a parameter can be", node)
        weight = self.builder.tensor(self.builder.transposed(matrix, self.source, node),
                                     self.source, node)
        return self.builder.emit("matvec", (weight.index, vector.index), (),
                                 (matrix.shape[1],), self.source.lineno(node))

    def has_children(self):
        """Whether this case's nodes have children (with arity=None, the internal case's
        have at least one): `node.children` as a condition, as the plain recursion's list."""
        return self.builder.num_children != 0

    def expr_UnaryOp(self, node, env):
        operand = self.expr(node.operand, env)
        if isinstance(node.op, ast.Not) and isinstance(operand, ChildrenView):
            return not self.has_children()
        if isinstance(node.op, ast.Not) and isinstance(operand, (bool, int)):
            return not operand
        if _is_number(operand) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node.op, ast.UAdd):
            return self.builder.tensor(operand, self.source, node)
        if isinstance(node.op, ast.USub):
            tensor = self.builder.tensor(operand, self.source, node)
            return self.builder.emit("unary", (tensor.index,), ("neg",), tensor.shape,
                                     self.source.lineno(node))
        raise self.unsupported(f"operator `{type(node.op).__name__}` on {_describe(operand)}",
                               node)

    def expr_Compare(self, node, env):
        if is_none_test(node):  # `b is None` of a helper's argument: known when it is called
            left = self.expr(node.left, env)
            right = self.expr(node.comparators[0], env)
            if len(node.ops) > 1:
                raise self.unsupported("a chain of `is` comparisons is not part of the cell "
                                       "language", node)
            return (left is right) == isinstance(node.ops[0], ast.Is)
        left = self.expr(node.left, env)
        result = True
        for operator, comparator in zip(node.ops, node.comparators):
            right = self.expr(comparator, env)
            if isinstance(left, VariableCount) and right == 0 or (
                    isinstance(right, VariableCount) and left == 0):
                left, right = (1, right) if isinstance(left, VariableCount) else (left, 1)
            if isinstance(left, VariableCount) or isinstance(right, VariableCount):
                raise self.unsupported("with arity=None the number of children differs from "
                                       "node to node, and a cell compares it with 0 only (a "
                                       "leaf or not); cases by the number of children need "
                                       "a fixed arity", node)
            if isinstance(left, ChildrenView) or isinstance(right, ChildrenView):
                raise self.unsupported("node.children is compared: a leaf is `node.is_leaf` "
                                       "(or `not node.children`), and the number of children "
                                       "is `node.num_children`", node)
            if not (_is_number(left) and _is_number(right)) or type(operator) not in COMPARISONS:
                raise self.unsupported("only the node's structure (numbers known at compile "
                                       "time) can be compared", node)
            result = result and COMPARISONS[type(operator)](left, right)
            left = right
        return result

    def expr_BoolOp(self, node, env):
        values = [self.concrete_bool(value, env) for value in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)

    def expr_IfExp(self, node, env):
        return self.expr(node.body if self.concrete_bool(node.test, env) else node.orelse, env)

    def expr_Lambda(self, node, env):
        raise self.unsupported("a lambda is not part of the cell language: a helper is a "
                               "`def` (inlined), and `map(f, node.children)` is "
                               "`[f(child) for child in node.children]`", node)

    def expr_GeneratorExp(self, node, env):
        generator = node.generators[0]
        each = self.each_child(self.expr(generator.iter, env))
        if each is not None and len(node.generators) == 1 and not generator.ifs:
            inner = dict(env)
            self.bind(generator.target, each, inner)
            return PerChild(self.expr(node.elt, inner))
        results = []
        self.comprehend(node, node.generators, dict(env), results)
        return results

    expr_ListComp = expr_GeneratorExp

    def comprehend(self, node, generators, env, results):
        if not generators:
            results.append(self.expr(node.elt, env))
            return
        generator = generators[0]
        for element in self.iterate(generator.iter, env):
            self.bind(generator.target, element, env)
            if all(self.concrete_bool(test, env) for test in generator.ifs):
                self.comprehend(node, generators[1:], env, results)

    def callee(self, node, env):
        value = self.expr(node.func, env)
        if isinstance(value, (bool, VariableCount)) or _is_number(value):
            text = ast.unparse(node.func)
            if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and isinstance(env.get(node.func.value.id), NodeView):
                raise self.unsupported(f"`{text}` is a property of the node, not a method: "
                                       f"write `{text}`, without `()`", node)
            raise self.unsupported(f"`{text}` is the number {value!r}, not a function", node)
        function = ops.as_cell_function(value)
        self.refuse_call(function, self.is_recursion(function), node)
        return function

    def call_arguments(self, node, env):
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self.unsupported("`*args` in a call is not part of the cell language", node)
        return ([self.expr(a, env) for a in node.args],
                {k.arg: self.expr(k.value, env) for k in node.keywords})

    def refuse_call(self, function, recursive, node):
        """Refuse, naming the line, a call of what the cell language does not call."""
        if not recursive and isinstance(function, type(self.builder.model)):
            raise self.unsupported(f"calling another recursive model ({function.__name__}) "
                                   "from a cell is not part of the cell language: a cell "
                                   "recurses into itself only; run the other model first and "
                                   "pass its states in as a field (node.x)", node)
        for refused, why in _REFUSED_CALLS:
            if any(function is one for one in refused):
                raise self.unsupported(why.format(name=function.__name__), node)
        pooling = _pooling_instead(function)
        if pooling is not None:
            raise self.unsupported("{} is not part of the cell language: {}".format(*pooling),
                                   node)
        if not (recursive or any(function is known for known in _CELL_FUNCTIONS)
                or is_user_helper(function) or _is_math(function)):
            raise self.unsupported(f"calling {_describe(function)} is not part of the cell "
                                   "language (use rj.tanh, rj.sigmoid, rj.relu, rj.exp, rj.log, "
                                   "rj.sqrt, rj.abs, rj.maximum, rj.minimum, rj.split, "
                                   "rj.concat, rj.zeros, rj.ones, Python's sum, abs, max and "
                                   "min, NumPy's tanh, exp, log, sqrt, abs, maximum, minimum, "
                                   "concatenate, dot or matmul, or a helper function)",
                                   node)

    def library_call(self, function, arguments, keywords, node, env):
        """A call of one of the cell language's functions (`_CELL_FUNCTIONS`)."""
        line = self.source.lineno(node)
        if function in ops.UNARY and len(arguments) == 1 and not keywords:
            tensor = self.builder.tensor(arguments[0], self.source, node)
            return self.builder.emit("unary", (tensor.index,), (ops.UNARY[function],),
                                     tensor.shape, line)
        if function in ops.BINARY and len(arguments) == 2 and not keywords:
            return self.elementwise("binary", ops.BINARY[function], *arguments, node, line)
        if function in ops.PRODUCTS and len(arguments) == 2 and not keywords:
            return self.matmul(*arguments, node)
        if function is ops.split:
            return self.split(arguments, keywords, node)
        if function is ops.concat:
            return self.concat(arguments, keywords, node)
        if function in (ops.zeros, ops.ones):
            return self.fill(0.0 if function is ops.zeros else 1.0, arguments, keywords, node)
        if function is builtins.sum:
            return self.sum(arguments, keywords, node)
        if function in (builtins.max, builtins.min):
            return self.max_or_min(function, arguments, keywords, node)
        if function in (builtins.zip, builtins.enumerate, builtins.range, builtins.len,
                        builtins.tuple, builtins.list, builtins.reversed):
            return self.sequence_call(function, arguments, keywords, node)
        if _is_math(function):
            return self.math_call(function, arguments, keywords, node)
        raise self.unsupported(f"calling {_describe(function)} with {len(arguments)} "
                               f"argument(s){' and keywords' if keywords else ''} is not part "
                               "of the cell language", node)

    def math_call(self, function, arguments, keywords, node):
        """A `math` function of numbers (`math.sqrt(2.0)`, `math.pi` folded in), computed
        now as the plain recursion computes it; of a tensor, refused for the `rj` one."""
        if all(_is_number(a) for a in (*arguments, *keywords.values())):
            return self.python_call(function, arguments, keywords, node)
        name = function.__name__
        other = next(a for a in (*arguments, *keywords.values()) if not _is_number(a))
        instead = (f"use rj.{name}, which is elementwise" if hasattr(ops, name)
                   else "the cell's own functions are listed in docs/cell_language.md")
        raise self.unsupported(f"math.{name} takes numbers, not {_describe(other)}: "
                               f"{instead}", node)

    def sequence_call(self, function, arguments, keywords, node):
        """zip, enumerate, range, len, tuple, list or reversed: of the children or values per
        child, of sequences known now, or of numbers; what Python itself refuses is refused
        here too."""
        if function is builtins.reversed and len(arguments) == 1 and not keywords:
            if isinstance(arguments[0], (ChildrenView, PerChild)) and \
                    self.builder.variable_arity:
                raise self.unsupported(
                    "`reversed` of the children with arity=None: their number is known at "
                    "run time only; `enumerate(node.children)` gives each child's place, and "
                    "`node.num_children - 1 - place` its place from the end", node)
            return self.sequence(arguments[0], node)[::-1]
        if function in (builtins.list, builtins.tuple) and len(arguments) == 1 and \
                isinstance(arguments[0], (ChildrenView, PerChild)):
            if self.builder.variable_arity:  # looped over, summed or mapped as they are
                return arguments[0]
            return function(self.sequence(arguments[0], node))
        if function in (builtins.zip, builtins.enumerate):
            each = [self.each_child(a) for a in arguments]
            if function is builtins.zip and each and all(e is not None for e in each):
                return PerChild(tuple(each))  # zip(node.children, states)
            if function is builtins.enumerate and each and each[0] is not None:
                return PerChild((self.child_place(arguments[1:], keywords, node), each[0]))
            iterables = arguments if function is builtins.zip else arguments[:1]
            return self.python_call(function, [self.sequence(a, node) for a in iterables]
                                    + list(arguments[len(iterables):]), keywords, node, list)
        if function is builtins.len and len(arguments) == 1 and isinstance(
                arguments[0], (ChildrenView, PerChild)):
            count = self.builder.num_children
            return VariableCount() if count is None else count  # as node.num_children
        if any(isinstance(a, VariableCount) for a in arguments):
            raise self.unsupported(f"`{function.__name__}` of the number of children: with "
                                   f"arity=None, {VARIABLE_CHILDREN} (`for child in "
                                   "node.children:`)", node)
        if not all(_is_number(a) or isinstance(a, (tuple, list, range)) for a in arguments):
            raise self.unsupported(f"`{function.__name__}` of a tensor", node)
        return self.python_call(function, arguments, keywords, node)

    def child_place(self, arguments, keywords, node):
        """What `enumerate(node.children, start)` counts at any one child: its place among the
        node's children, from `start` (0, or a number), a number per child."""
        start = _enumerate_start(arguments, keywords)
        if not _is_number(start):
            raise self.unsupported("enumerate's start must be a number", node)
        place = self.builder.emit("child_position", (), (), (), self.source.lineno(node))
        return place if start == 0 else self.binary(ast.Add(), place, start, node)

    def python_call(self, function, arguments, keywords, node, then=None):
        """`function(*arguments, **keywords)` (and `then` of that), or the error Python raises
        for it as an `UnsupportedError` at its line, as the plain recursion would raise it."""
        try:
            value = function(*arguments, **keywords)
            return value if then is None else then(value)
        except (TypeError, ValueError, OverflowError) as error:
            raise self.unsupported(f"`{function.__name__}` raises {type(error).__name__} here "
                                   f"({error})", node) from None

    def recursive_call(self, arguments, node):
        context = self.builder.context
        if len(arguments) != 2 + len(context) or not isinstance(arguments[1], ParamsView) \
                or any(a is not c for a, c in zip(arguments[2:], context)):
            expected = ", ".join(["child", "p"] + [c.name for c in context])
            raise self.unsupported("a recursive call must pass the parameters and the context "
                                   f"on unchanged: cell({expected})", node)
        child = arguments[0]
        if not isinstance(child, NodeView) or child.child is None:
            raise self.unsupported("a recursive call must take a child of the node", node)
        shapes, is_tuple = self.builder.state
        line = self.source.lineno(node)
        states = tuple(self.builder.emit("child_state", (), (child.child, component), shape, line)
                       for component, shape in enumerate(shapes))
        return states if is_tuple else states[0]

    def split(self, arguments, keywords, node):
        """`rj.split(x, n)` or `np.split(x, n)`: n equal parts; `np.split(x, [a, b])`: the
        parts before a, from a to b, and from b on."""
        parts = arguments[1] if len(arguments) == 2 else None
        at_indices = isinstance(parts, (tuple, list)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in parts)
        if keywords or not (at_indices or isinstance(parts, int)):
            raise self.unsupported("split takes a vector and a constant number of parts, or a "
                                   "list of constant indices", node)
        tensor = self.builder.tensor(arguments[0], self.source, node)
        if len(tensor.shape) != 1 or not at_indices and (parts < 1 or tensor.shape[0] % parts):
            raise self.shape_error(f"cannot split shape {tensor.shape} into {parts} equal "
                                   "parts", node)
        length = tensor.shape[0]
        if at_indices:  # as NumPy clips them
            bounds = [min(max(i + length if i < 0 else i, 0), length) for i in parts]
        else:
            bounds = [k * length // parts for k in range(1, parts)]
        spans = list(zip([0, *bounds], [*bounds, length]))
        if at_indices and any(stop <= start for start, stop in spans):
            raise self.shape_error(f"splitting shape {tensor.shape} at {list(parts)} leaves an "
                                   "empty part", node)
        line = self.source.lineno(node)
        return tuple(self.builder.emit("slice", (tensor.index,), (start, stop),
                                       (stop - start,), line) for start, stop in spans)

    def concat(self, arguments, keywords, node):
        if len(arguments) != 1 or keywords or not isinstance(arguments[0], (tuple, list)):
            raise self.unsupported("rj.concat takes one list of vectors", node)
        parts = [self.builder.tensor(a, self.source, node) for a in arguments[0]]
        if not parts or any(len(p.shape) not in (1, 2) or p.shape[1:] != parts[0].shape[1:]
                            for p in parts):
            raise self.shape_error("rj.concat joins vectors, or matrices with the same number "
                                   "of columns (stacked as rows), not shapes "
                                   f"{[p.shape for p in parts]}", node)
        shape = (sum(p.shape[0] for p in parts),) + parts[0].shape[1:]
        return self.builder.emit("concat", tuple(p.index for p in parts), (), shape,
                                 self.source.lineno(node))

    def fill(self, value, arguments, keywords, node):
        shape = arguments[0] if len(arguments) == 1 and not keywords else None
        shape = (shape,) if isinstance(shape, int) else shape
        if not isinstance(shape, tuple) or not all(isinstance(e, int) and e > 0 for e in shape):
            raise self.unsupported("rj.zeros/rj.ones take a constant shape", node)
        return self.builder.emit("fill", (), (value,), shape, self.source.lineno(node))

    def sum(self, arguments, keywords, node):
        if len(arguments) in (1, 2) and not keywords and isinstance(arguments[0], PerChild):
            term = self.builder.tensor(arguments[0].value, self.source, node)
            return self.sum_over_children(term, arguments[1] if len(arguments) == 2 else None,
                                          node)
        if len(arguments) not in (1, 2) or keywords or not isinstance(arguments[0], (list, tuple)):
            raise self.unsupported("sum takes a generator or list of tensors", node)
        items = list(arguments[0])
        total = arguments[1] if len(arguments) == 2 else 0
        for item in items:
            total = self.binary(ast.Add(), total, item, node)
        return total

    def max_or_min(self, function, arguments, keywords, node):
        """Python's max and min of numbers: constants, `node.num_children` (`total /
        max(node.num_children, 1)`), scalar parameters; of vectors they raise in the plain
        recursion."""
        if keywords or len(arguments) < 2 or not all(
                _is_number(a) or isinstance(a, VariableCount) or getattr(a, "shape", None) == ()
                for a in arguments):
            extreme = f"{function.__name__}imum"
            if any(isinstance(a, PerChild) for a in arguments):
                raise self.unsupported(f"{function.__name__} takes numbers: "
                                       f"{_EXTREME_LOOP.format(extreme)}", node)
            raise self.unsupported(f"{function.__name__} takes two or more numbers "
                                   f"(node.num_children, a scalar parameter); of vectors, use "
                                   f"rj.{extreme}", node)
        if all(_is_number(a) for a in arguments):
            return function(arguments)
        total = arguments[0]
        for argument in arguments[1:]:
            total = self.elementwise("binary", f"{function.__name__}imum", total, argument,
                                     node, self.source.lineno(node))
        return total

    def helper_call(self, source, env):
        return self.builder.call(source, env, self.depth + 1)

    def method_object(self, method):
        """The object a bound method was read with, by the method's path plus `__self__`."""
        outside = self.builder.outside
        path = outside.path_of(method)
        if path is not None:
            outside.read(path.child("__self__"), method.__self__)
        return method.__self__

    def defaults(self, function, node):
        """A helper's default arguments (positional, by keyword), read by the helper's path
        (`helper.__defaults__`), since a list among them can change between runs."""
        outside = self.builder.outside
        defaults = function.__defaults__ or ()
        keyword_defaults = function.__kwdefaults__ or {}
        path = outside.path_of(function)
        if path is None:
            if not all(is_immutable(value) for value in (*defaults, *keyword_defaults.values())):
                raise self.unsupported(f"helper {function.__name__} has default arguments that "
                                       "can change, and was not read by a name the cell can "
                                       "check at every run; call it by its name", node)
            return defaults, keyword_defaults
        if defaults:
            outside.read(path.child("__defaults__"), defaults)
            for index, value in enumerate(defaults):
                outside.register(path.child("__defaults__").child(Item(index)), value)
        if keyword_defaults:
            outside.read(path.child("__kwdefaults__"), keyword_defaults)
            for name, value in keyword_defaults.items():
                outside.register(path.child("__kwdefaults__").child(Item(name)), value)
        return defaults, keyword_defaults


def accumulators(body):
    """{name: how}: the names that a loop body only updates, and reads nowhere else, as
    `acc = acc + x` (or `acc + x + y`) or `acc += x` (how: "sum"), or as a call of two
    arguments, one of them the name, `acc = rj.maximum(acc, x)` (how: "call"; the builder
    checks the function)."""
    assignments, reads, updates, read_by_updates = Counter(), Counter(), {}, Counter()
    for node in (inner for statement in body for inner in ast.walk(statement)):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                reads[node.id] += 1
            else:
                assignments[node.id] += 1
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) \
                and isinstance(node.op, ast.Add):
            updates.setdefault(node.target.id, []).append("sum")
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add):
                how, operands = "sum", _summands(node.value)
            elif isinstance(node.value, ast.Call) and len(node.value.args) == 2 \
                    and not node.value.keywords:
                how, operands = "call", node.value.args
            else:
                continue
            if any(isinstance(o, ast.Name) and o.id == name for o in operands):
                updates.setdefault(name, []).append(how)
                read_by_updates[name] += 1
    return {name: hows[0] for name, hows in updates.items()
            if len(set(hows)) == 1 and len(hows) == assignments[name]
            and reads[name] == read_by_updates[name]}


def _summands(expression):
    """The operands of a chain of `+` (`acc + a + b`: acc, a and b)."""
    if isinstance(expression, ast.BinOp) and isinstance(expression.op, ast.Add):
        return _summands(expression.left) + _summands(expression.right)
    return [expression]


_ALLOCATING_FUNCTIONS = (*ops.UNARY, *ops.BINARY, *ops.PRODUCTS, ops.concat, ops.zeros,
                         ops.ones, builtins.sum)
_CELL_FUNCTIONS = (*_ALLOCATING_FUNCTIONS, ops.split, builtins.range, builtins.len,
                   builtins.tuple, builtins.list, builtins.zip, builtins.enumerate,
                   builtins.reversed, builtins.max, builtins.min)
_REFUSED_CALLS = (  # what a cell might call that the language refuses, and what to write
    ((np.zeros, np.ones),
     ("np.{name} makes float64 arrays, which would make a float32 plain recursion float64: "
      "use rj.{name}(shape), which takes the parameters' dtype")),
    ((builtins.print,),
     ("print runs in model.reference(forest, p), the plain recursion, but is not part of "
      "the compiled cell language: remove it before run")),
    ((np.array, np.asarray),
     ("np.{name} makes an array inside the cell: pass a constant array as a parameter "
      "(p.name), or build one with rj.zeros, rj.ones and rj.concat")),
    ((builtins.sorted,),
     ("sorted is not part of the cell language: the children are taken in the forest's "
      "order, and `enumerate(node.children)` gives each child's place")),
    ((builtins.map, builtins.filter),
     ("{name} is not part of the cell language: a list comprehension is (`[f(child, p) for "
      "child in node.children]`)")),
)
_ELEMENTS_SUM = "a vector's elements add up as np.dot(v, rj.ones(v.shape))"
_ELEMENTS_MEAN = "a vector's mean is np.dot(v, rj.ones(v.shape)) / v.shape[0]"
_TENSOR_METHODS_INSTEAD = {  # what a NumPy habit writes instead of a method the cell lacks
    "dot": "write `a @ b` (or np.dot(a, b))",
    "sum": _ELEMENTS_SUM,
    "mean": _ELEMENTS_MEAN,
    "reshape": "a state keeps its shape; a vector's parts are slices or rj.split",
    "copy": "the cell computes new values: `acc = h + x`, not a copy updated with `+=`",
}
_EXTREME_LOOP = ("a {0} over the children is a loop, `best = rj.{0}(best, h)` for each "
                 "child's state h, from a start before it (-math.inf, rj.zeros(...)); of two "
                 "tensors, rj.{0}(a, b)")
_POOLING_INSTEAD = {  # NumPy's ways to pool a stack of the children's states, and the cell's
    np.sum: ("Python's sum adds up the children's states or a list's items, and "
             + _ELEMENTS_SUM),
    np.mean: ("the children's mean is sum(states) / len(states) (or a sum over "
              "node.children / node.num_children), and " + _ELEMENTS_MEAN),
    np.max: _EXTREME_LOOP.format("maximum"), np.min: _EXTREME_LOOP.format("minimum"),
    np.stack: ("keep the children's states a list and pool them with sum(states), "
               "sum(states) / len(states), or a loop, `best = rj.maximum(best, h)`"),
}


def _pooling_instead(function):
    """(how a cell names `function`, what to write instead) where it is one of NumPy's ways to
    pool a stack of the children's states (`_POOLING_INSTEAD`, `np.amax`, `np.maximum.reduce`
    and the like), else None."""
    owner = getattr(function, "__self__", None)
    if getattr(function, "__name__", None) == "reduce" and owner in (np.maximum, np.minimum):
        meant = np.max if owner is np.maximum else np.min
        return f"np.{owner.__name__}.reduce", _POOLING_INSTEAD[meant]
    aliases = {np.amax: np.max, np.amin: np.min, np.vstack: np.stack}
    meant = next((meant for alias, meant in aliases.items() if function is alias), function)
    if not any(meant is known for known in _POOLING_INSTEAD):
        return None
    return _describe(function), _POOLING_INSTEAD[meant]


_OVER_CHILDREN_BY = {"maximum": "child_max", "minimum": "child_min"}  # a running update's op
_OPERATOR_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/",
                     ast.MatMult: "@"}


def _enumerate_start(arguments, keywords):
    """The `start` of a call `enumerate(iterable, *arguments, **keywords)`."""
    if len(arguments) > 1 or set(keywords) - {"start"} or (arguments and keywords):
        return None
    return arguments[0] if arguments else keywords.get("start", 0)


def _names(target):
    """The names an assignment target binds."""
    return {node.id for node in ast.walk(target) if isinstance(node, ast.Name)}


def _is_number(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _is_math(function):
    """Whether `function` is one of Python's `math` module's."""
    return getattr(function, "__module__", None) == "math"


def _returned(returned, value):
    """What a cell returned that is not a state (`value`, the whole or one of its values),
    said with what to write instead."""
    if returned is None:
        return "None (does every case reach a `return`?)"
    if value is None:
        return "a tuple holding None"
    if isinstance(returned, list):
        return "a list: write `return a, b` for a state of several tensors"
    return "a tuple holding tuples or lists: return its tensors side by side, `return a, b`"


def _describe(value):
    if isinstance(value, Tensor):
        return f"a tensor of shape {value.shape}"
    if isinstance(value, NodeView):
        return ("a node" if value.child is None else "a child" if value.child == EACH
                else f"child {value.child}")
    if isinstance(value, (tuple, list)):
        return (f"a {type(value).__name__} of {len(value)} "
                f"({', '.join(_describe(item) for item in value)})")
    if isinstance(value, ChildrenView):
        return "node.children"
    if isinstance(value, ChildLocal) and value.updated_at is not None:
        name, lines = value.name, value.updated_at
        updates = f"`{name} = {name} + x`, `{name} += x`, `{name} = rj.maximum({name}, x)`"
        if len(lines) > 1:
            return (f"`{name}`, changed per child at lines "
                    f"{', '.join(map(str, lines[:-1]))} and {lines[-1]} (a value accumulates "
                    f"over any number of children by one update a child, {updates} or "
                    "`rj.minimum`, with x computed before it),")
        return (f"`{name}`, changed per child at line {lines[0]} other than by a sum or a "
                f"running maximum or minimum (only {updates} and `rj.minimum` accumulate over "
                "any number of children, not a product),")
    if isinstance(value, ChildLocal):
        return (f"`{value.name}`, a value computed per child inside a loop over "
                "node.children (it has no single value after the loop)")
    if isinstance(value, PerChild):
        return "a value per child"
    if isinstance(value, VariableCount):
        return "node.num_children (not known at compile time with arity=None)"
    if isinstance(value, ParamsView):
        return "the parameters"
    if isinstance(value, ParamArray):
        return f"parameter {value.name!r}"
    if isinstance(value, NodeField):
        return f"field {value.name!r}"
    if callable(value):
        name = getattr(value, "__qualname__", repr(value))
        if (getattr(value, "__module__", None) or "").split(".")[0] == "numpy":
            return f"np.{name}"
        return name
    return repr(value)


def build_cell_ir(model, source, params, field_specs, arity):
    """Specialise the cell to each structural case (a leaf, an internal node with `arity`
    children) and infer every shape from `params` and the forest's `field_specs`."""
    arguments = positional_arguments(source.tree.args)
    cases, builders = [], []
    state = None
    outside = Captured()
    for num_children in (0, arity):  # arity None: any number of children
        builder = CaseBuilder(model, params, field_specs, num_children, state, outside)
        builder.context = tuple(builder.parameter(name, source, source.tree)
                                for name in arguments[2:])
        env = {arguments[0]: NodeView(), arguments[1]: ParamsView(),
               **{c.name: c for c in builder.context}}
        ran = builder.run(source, env)
        returned = ran.value
        is_tuple = isinstance(returned, tuple)
        values = returned if is_tuple else (returned,)
        where = {"filename": source.filename, "lineno": source.lineno(source.tree)}
        tensors = []
        for value in values:
            if isinstance(value, (tuple, list)) or value is None:
                raise UnsupportedError("a cell returns a tensor or a flat tuple of tensors, "
                                       f"not {_returned(returned, value)}",
                                       **source.where(ran.node))
            tensors.append(builder.tensor(value, source, ran.node))
        shapes = tuple(t.shape for t in tensors)
        if any(0 in shape for shape in shapes):
            raise ShapeError(f"the {builder.case_name} case returns states of shapes {shapes}; "
                             "a state needs at least one element (are the parameters empty?)",
                             **where)
        if state is None:
            state = (shapes, is_tuple)
        elif (shapes, is_tuple) != state:
            raise ShapeError(f"the {builder.case_name} case returns states of shapes {shapes} "
                             f"but leaves return {state[0]}; both must match", **where)
        name = "leaf" if num_children == 0 else "internal"
        cases.append(CellCase(name, num_children, tuple(builder.ops),
                              tuple(t.index for t in tensors)))
        builders.append(builder)
    read = {attribute(op.attrs[0]): getattr(params, attribute(op.attrs[0]))
            for case in cases for op in case.ops if op.kind == "param" or op.kind == "gather"}
    parameters = {name: shape_and_dtype(value)[0] for name, value in read.items()}
    for name in {op.attrs[0] for case in cases for op in case.ops if op.kind == "param"}:
        if name != attribute(name) and label(name) in parameters:
            raise InputError(f"parameter {label(name)!r} and `p.{name}` would share the "
                             "kernel's names for their products; rename the parameter")
    by_dtype = {}
    for name, value in sorted(read.items()):
        if not is_weak(value):  # a Python number takes the arrays' dtype
            by_dtype.setdefault(str(shape_and_dtype(value)[1]), []).append(name)
    if len(by_dtype) > 1:
        mix = "; ".join(f"{dtype}: {', '.join(names)}" for dtype, names in sorted(by_dtype.items()))
        raise InputError(f"parameters mix dtypes ({mix}); use one of float32 or float64 "
                         "throughout (a Python number takes the arrays' dtype)")
    dtype = next(iter(by_dtype), "float64")
    fields = {op.attrs[0]: field_specs[op.attrs[0]] for case in cases for op in case.ops
              if op.kind == "field"}
    gathers = tuple(sorted((case.name, table, field) for builder, case in zip(builders, cases)
                           for table, field in builder.gathers))
    fields.update((field, field_specs[field]) for _, _, field in gathers)
    return CellIR(source.tree.name, tuple(cases), state[0], state[1], dtype, parameters,
                  fields, gathers, source.filename, outside.done())
