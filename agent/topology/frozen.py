"""Frozen value classes that cost nothing to define: the model's and the policy's records.

``@dataclass(frozen=True, slots=True)`` imports :mod:`dataclasses` (and with it ``inspect``, ``ast``, ``dis``,
``enum``, ``re``: 7 ms) and compiles each class's methods at import (0.5 ms a class): a tenth of every
``topology-agent discover``, which is compared with lscpu (issue 23). A :class:`Frozen` subclass lists its
fields in ``__slots__`` and writes its ``__init__`` (positional-or-keyword parameters in ``__slots__`` order,
storing each with ``object.__setattr__``); the rest is what the dataclass would have:

* ``==`` on the fields' tuple, same class only; ``hash`` of the same tuple; ``repr`` ``Name(field=value, ...)``;
* assignment and deletion raise :class:`dataclasses.FrozenInstanceError`; pickling and copying through
  ``__getstate__``/``__setstate__``; ``__match_args__``;
* :mod:`dataclasses`' functions (``replace``, ``fields``, ``asdict``, ``is_dataclass``) work on them:
  ``__dataclass_fields__`` is made on first use, from a dataclass of the same fields and defaults (the
  defaults read from ``__init__``), by whoever imported :mod:`dataclasses` anyway.

Type checkers see a frozen dataclass (``dataclass_transform``). ``tests/test_frozen.py`` holds every class to
the dataclass it replaces.
"""

from __future__ import annotations

from _operator import attrgetter  # operator's C half: the Python module around it costs 0.5 ms to import

TYPE_CHECKING = False  # not typing's: discover starts without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from dataclasses import Field
    from typing import Any, ClassVar, Self, dataclass_transform
else:
    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls

_set = object.__setattr__


class _DataclassFields:
    """``__dataclass_fields__`` of a :class:`Frozen` subclass, made when first asked for."""

    def __get__(self, instance: object, owner: type[Frozen]) -> dict[str, Field[Any]]:
        import dataclasses

        init = owner.__init__
        code = init.__code__
        names = code.co_varnames[1:code.co_argcount]
        if tuple(names) != owner.__slots__ or code.co_kwonlyargcount:
            raise TypeError(f"{owner.__qualname__}.__init__ must take the fields {owner.__slots__} in order")
        defaults = init.__defaults__ or ()
        first = len(names) - len(defaults)
        annotations = owner.__annotations__
        spec: list[tuple[str, object] | tuple[str, object, object]] = [
            (name, annotations.get(name, "object")) if i < first
            else (name, annotations.get(name, "object"), dataclasses.field(default=defaults[i - first]))
            for i, name in enumerate(names)]
        shadow: Any = dataclasses.make_dataclass(owner.__name__, spec, frozen=True)
        fields: dict[str, Field[Any]] = shadow.__dataclass_fields__
        type.__setattr__(owner, "__dataclass_fields__", fields)  # made once: the dict replaces this descriptor
        return fields


@dataclass_transform(frozen_default=True, eq_default=True)
class Frozen:
    """Base of frozen records; see the module's text."""

    __slots__: ClassVar[tuple[str, ...]] = ()
    _values: ClassVar[Callable[[Any], tuple[Any, ...]]]  # the fields' values as a tuple: type(self)._values(self)
    if not TYPE_CHECKING:
        __dataclass_fields__ = _DataclassFields()

    def __init_subclass__(cls) -> None:
        names = cls.__slots__
        if len(names) == 1:
            name = names[0]
            cls._values = staticmethod(lambda self: (getattr(self, name),))
        else:
            cls._values = staticmethod(attrgetter(*names))
        setattr(cls, "__match_args__", names)  # noqa: B010 (type checkers take it from the fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return bool(type(self)._values(self) == type(self)._values(other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(type(self)._values(self))

    def __repr__(self) -> str:
        values = type(self)._values(self)
        inner = ", ".join(f"{name}={value!r}" for name, value in zip(self.__slots__, values, strict=True))
        return f"{self.__class__.__qualname__}({inner})"

    def _replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (what ``dataclasses.replace`` does, without importing dataclasses on discover's
        path); an unknown field is a TypeError, as there."""
        values = dict(zip(self.__slots__, type(self)._values(self), strict=True))
        unknown = changes.keys() - values.keys()
        if unknown:
            raise TypeError(f"{self.__class__.__qualname__} has no field(s) {', '.join(sorted(unknown))}")
        return type(self)(**{**values, **changes})

    def __setattr__(self, name: str, value: object) -> None:
        from dataclasses import FrozenInstanceError

        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        from dataclasses import FrozenInstanceError

        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> list[Any]:
        return list(type(self)._values(self))

    def __setstate__(self, state: list[Any]) -> None:
        for name, value in zip(self.__slots__, state, strict=False):
            _set(self, name, value)
