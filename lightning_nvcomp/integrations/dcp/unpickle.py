"""A ``.metadata`` pickle read under ``weights_only`` rules: :func:`restricted_loads`.

Why not torch's own ``weights_only`` unpickler (``torch._weights_only_unpickler``): it reads pickle protocol 2 only
(``torch.save``'s), and every ``.metadata`` - DCP's and ours, of every version - is protocol 4 (``pickle.dump``'s
default): it fails all of them (``Unsupported operand 149``, protocol 4's FRAME). Being pure Python, it is also
35 times slower than the C unpickler on a large checkpoint's metadata (57,600 items: 15.6 s against 0.44 s).
:func:`restricted_loads` keeps its rules with the C unpickler:

* Only the names given are imported (``find_class``), each with one use (:data:`MADE`, :data:`CALLED`,
  :data:`VALUE`); any other name, and any persistent id, is refused before anything is made.
* A class may only be made empty and given its fields (NEWOBJ then BUILD: a dataclass), a callable only called for
  a value (REDUCE: a ``torch.Size``, a path, an enum member), and nothing else is given state: BUILD sets attributes,
  so on a class, an enum member or a dtype it would change them for the whole process.

The C unpickler has no hook for the last two rules, so the pickle is read twice: first with inert stand-ins for
every name (:class:`_StandIn` classes and :class:`_Value` objects), which refuse every other use; only then with the
real names. The pickle's operations do not depend on the objects they are applied to, so the second pass does
exactly what the first one showed. The stand-ins hold nothing and nothing changes them: they are made once.
"""

from __future__ import annotations

import functools
import io
import pickle
from collections.abc import Mapping
from typing import Any

#: How a pickle may use a name: a class made empty and given its fields (NEWOBJ, BUILD), a callable called for a
#: value that takes no state (REDUCE), or a value (a dtype).
MADE, CALLED, VALUE = "made", "called", "value"


class Refused(Exception):
    """What a restricted pickle may not do (the message: "it imports os.system", "it calls ..."); ``name``: the name
    it imports, where that is what is refused."""

    def __init__(self, what: str, name: str = "") -> None:
        super().__init__(what)
        self.name = name


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, names: Mapping[str, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._names = names

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._names[f"{module}.{name}"]
        except KeyError:
            raise Refused(f"it imports {module}.{name}", f"{module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("it holds a persistent id")


def restricted_loads(data: bytes, names: Mapping[str, tuple[Any, str]]) -> Any:
    """Unpickle ``data``, which may import only ``names`` (``{"module.name": (the object, its use)}``), each only as
    its use says (see the module docstring).

    Raises:
        Refused: a name not in ``names``, a persistent id, or a name used otherwise (the message says which).
        What a malformed pickle raises (``UnpicklingError``, ``EOFError``, ``TypeError``...).
    """
    _Unpickler(data, _stand_ins(tuple((name, use) for name, (_, use) in sorted(names.items())))).load()
    return _Unpickler(data, {name: obj for name, (obj, _) in names.items()}).load()


@functools.cache
def _stand_ins(uses: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """An inert stand-in for each name, by its use."""
    return {
        name: _Value(name) if use == VALUE else _StandInType(name, (_StandIn,), {"use": use, "name": name})
        for name, use in uses
    }


class _StandInType(type):
    """The class of the stand-ins for classes and callables: calling one (REDUCE) gives a :class:`_Value`."""

    use: str
    name: str

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.use != CALLED:
            raise Refused(f"it calls {cls.name}")
        return _Value(f"what {cls.name} returns")

    @property
    def __setstate__(cls) -> Any:  # BUILD on the class itself (found before the instances' method: a data descriptor)
        raise Refused(f"it sets attributes of {cls.name} itself")


class _StandIn(metaclass=_StandInType):
    """A stand-in class: made empty (NEWOBJ) where its name is :data:`MADE`, and then given any state (BUILD)."""

    use, name = MADE, ""

    def __new__(cls, *args: Any) -> Any:
        if cls.use != MADE:
            raise Refused(f"it makes {cls.name} without calling it")
        return object.__new__(cls)

    def __setstate__(self, state: Any) -> None:
        return None


class _Value:
    """A stand-in for a value that takes no state: a dtype, what a callable returns."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise Refused(f"it calls {self.name}")

    def __setstate__(self, state: Any) -> None:
        raise Refused(f"it sets attributes of {self.name}")
