"""Resolving the names a cell function uses (`rj.tanh`, helper functions, the model itself,
constants), and remembering what it reads from outside its body: a kernel is compiled for
those values, so a run must see when one is bound to another or changed in place."""
import ast
import builtins
import operator
import sys
import types
from dataclasses import dataclass

import numpy as np

UNRESOLVED = object()


def resolve(source, expr):
    """The Python object `expr` (a Name or a dotted Attribute chain) denotes in the function's
    scope, or UNRESOLVED."""
    chain = dotted(expr)
    return UNRESOLVED if chain is None else OutsideName(source.function, chain).value()


def dotted(expr):
    """("config", "scale") for `config.scale`; None for anything but a dotted name."""
    attributes = []
    while isinstance(expr, ast.Attribute):
        attributes.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return (expr.id, *reversed(attributes))


@dataclass(frozen=True)
class Item:
    """A step of an `OutsideName` that reads an item (`CONFIGS[0]`, a helper's default)."""

    key: object


class OutsideName:
    """A path a function reads from its closure, its module's globals or the builtins: a name,
    then attributes and `Item`s (`rj.tanh`, `SCALE`, `helper`, `CONFIGS[0].scale`,
    `helper.__defaults__[1]`). Every run reads what it denotes (`value`), so the scope it is
    looked up in is found once."""

    __slots__ = ("_cell", "_globals", "chain", "function")

    def __init__(self, function, chain):
        self.function = function
        self.chain = chain
        code = function.__code__
        self._cell = (function.__closure__[code.co_freevars.index(chain[0])]
                      if chain[0] in code.co_freevars else None)
        self._globals = function.__globals__

    def __eq__(self, other):
        return (isinstance(other, OutsideName) and other.function is self.function
                and other.chain == self.chain)

    def __hash__(self):
        return hash((id(self.function), self.chain))

    def __str__(self):
        return self.chain[0] + "".join(f"[{step.key!r}]" if isinstance(step, Item) else f".{step}"
                                       for step in self.chain[1:])

    def child(self, step):
        """This path followed by an attribute name or an `Item`."""
        return OutsideName(self.function, (*self.chain, step))

    def value(self):
        value = _EMPTY
        if self._cell is not None:
            try:
                value = self._cell.cell_contents
            except ValueError:  # a closure variable not assigned yet
                pass
        if value is _EMPTY:
            value = self._globals.get(self.chain[0], _EMPTY)
        if value is _EMPTY:
            value = getattr(builtins, self.chain[0], UNRESOLVED)
        for step in self.chain[1:]:
            if not isinstance(step, Item):
                value = getattr(value, step, UNRESOLVED)
                continue
            try:
                value = value[step.key]
            except (LookupError, TypeError):
                return UNRESOLVED
        return value


_EMPTY = object()


def read_outside(names):
    """The dotted names a cell reads from outside its body (an `OutsideNames`), less each
    module that is read only for its attributes (`rj` of `rj.tanh`: those are read
    themselves)."""
    extended = {(name.function, name.chain[:-1]) for name in names if len(name.chain) > 1}
    return OutsideNames(tuple(name for name in names
                              if not ((name.function, name.chain) in extended
                                      and isinstance(name.value(), types.ModuleType))))


class OutsideNames:
    """`OutsideName`s, and what they denote now (`values`), which every run reads: the names
    rooted at a module's globals in one `attrgetter` call a module (`rj.tanh`, `SCALE` and
    `helper` at once), the others (closure variables, builtins) one by one."""

    def __init__(self, names):
        by_module, others = {}, []
        for name in names:
            module = sys.modules.get(getattr(name.function, "__module__", None) or "")
            if name._cell is None and module is not None and vars(module) is name._globals \
                    and name.chain[0] in name._globals \
                    and not any(isinstance(step, Item) for step in name.chain):
                by_module.setdefault(module, []).append(name)
            else:
                others.append(name)
        self.names = tuple(name for group in by_module.values() for name in group) + tuple(
            others)
        self._getters = tuple((module, operator.attrgetter(*(str(name) for name in group)),
                               len(group))
                              for module, group in by_module.items())
        self._others = tuple(others)

    def values(self):
        """What the names denote now, in the order of `names`, as objects to compare by
        identity."""
        values = []
        try:
            for module, getter, count in self._getters:
                got = getter(module)
                values.extend(got if count > 1 else (got,))
        except AttributeError:  # a global deleted, or an attribute: read each as Python does
            return tuple(name.value() for name in self.names)
        values.extend(name.value() for name in self._others)
        return tuple(values)


def frozen_values(values):
    """`values` (from `OutsideNames.values`) as a key that two bindings of the names share
    when they compile the same kernel: numbers and strings by type and value (floats by repr,
    so NaN equals itself and -0.0 is not 0.0), tuples, lists and dicts element by element, a
    bound method by its function and object, anything else (functions, modules, models,
    objects whose attributes are paths of their own) by identity."""
    return tuple(_frozen(value) for value in values)


class Binding:
    """What the outside names denoted when a cell was analysed (`values`, in the order of
    `OutsideNames.names`). A run asks whether they still do (`holds`): each by identity, and a
    list or dict (which can change without being bound again), a tuple holding one, or a bound
    method (made anew at every read) by value."""

    def __init__(self, values):
        self.values = values
        self.key = frozen_values(values)  # equal for bindings that compile the same kernel
        self._by_value = tuple((index, self.key[index]) for index, value in enumerate(values)
                               if _compared_by_value(value))
        by_value = {index for index, _ in self._by_value}
        self._by_identity = tuple(index for index in range(len(values)) if index not in by_value)
        self._identities = tuple(values[index] for index in self._by_identity)

    def holds(self, now):
        if all(map(operator.is_, (now[index] for index in self._by_identity),
                   self._identities)):
            return all(_frozen(now[index]) == then for index, then in self._by_value)
        return frozen_values(now) == self.key  # another float object of the same value

    def changed(self, now):
        """The index of the first value that no longer holds, or None."""
        for index, (then, value) in enumerate(zip(self.key, now)):
            if _frozen(value) != then:
                return index
        return None


def _compared_by_value(value):
    if isinstance(value, (list, dict, types.MethodType)):
        return True
    return isinstance(value, tuple) and any(_compared_by_value(element) for element in value)


def _frozen(value):
    if isinstance(value, (float, complex)):
        return (type(value), repr(value))
    if isinstance(value, (bool, int, str, bytes, type(None))):
        return (type(value), value)
    if isinstance(value, np.generic):
        return (type(value), repr(value.item()))
    if isinstance(value, (tuple, list)):
        return (type(value), frozen_values(value))
    if isinstance(value, dict):
        return (dict, tuple((_frozen(key), _frozen(item)) for key, item in value.items()))
    if isinstance(value, types.MethodType):
        return (types.MethodType, _Identity(value.__func__), _Identity(value.__self__))
    return _Identity(value)


class Captured:
    """The values a cell's build read from outside its body, each with the path it read it by
    (`OutsideName`s): the kernel computes with them, so a run re-reads every path (`holds`)
    and builds the cell again where one changed, as the plain recursion, which reads them
    live, would see it. Objects the build read further into (a namespace, a list, a helper
    whose defaults it took) are registered with their paths (`path_of`): an attribute of one
    is a path of its own."""

    def __init__(self):
        self.reads = {}  # OutsideName → the value read, in the order read
        self._paths = {}  # id of an object read → (its path, the object, kept alive)
        self.names = self.binding = None

    def read(self, path, value):
        """Record that the build read `value` by `path`; returns `value`."""
        self.reads.setdefault(path, value)
        self.register(path, value)
        return value

    def register(self, path, value):
        """Remember where `value` was read, for reads further into it, without comparing it
        at each run (an element of a list that is compared as a whole)."""
        if not isinstance(value, (bool, int, float, str, type(None))):
            self._paths.setdefault(id(value), (path, value))

    def path_of(self, value):
        """The path `value` was read by, or None for a value the build made or computed."""
        entry = self._paths.get(id(value))
        return entry[0] if entry is not None and entry[1] is value else None

    def done(self):
        """Freeze what was read; a run then asks `holds`."""
        self.names = OutsideNames(tuple(self.reads))
        self.binding = Binding(tuple(self.reads[name] for name in self.names.names))
        self._paths = {}
        return self

    def holds(self):
        return self.binding.holds(self.names.values())

    def changed(self):
        """The path whose value is no longer what the build read, or None."""
        index = self.binding.changed(self.names.values())
        return None if index is None else self.names.names[index]


def is_immutable(value):
    """Whether nothing can change what `value` holds: a number, a string, None, or a tuple or
    frozenset of such (a value read by a path stays what it was while the path reads it)."""
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None), range, np.generic,
                          np.dtype)):
        return True
    return isinstance(value, (tuple, frozenset)) and all(is_immutable(item) for item in value)


class _Identity:
    """Compares equal to another only for the same object, whatever the object's own `==`
    (a NumPy array's is elementwise); keeps the object alive, so its id is not reused."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.value is self.value

    def __hash__(self):
        return id(self.value)


def is_plain_function(obj):
    return callable(obj) and hasattr(obj, "__code__") and hasattr(obj, "__globals__")


def is_user_helper(obj):
    """A plain Python function of the user's (inlined), not one of recjit's, NumPy's or the
    standard library's."""
    module = (getattr(obj, "__module__", "") or "").split(".")[0]
    return is_plain_function(obj) and module not in ("recjit", "numpy", "builtins", "math")
