"""How the pure state machines declare their events and actions: one convention.

What it owns
------------
Every machine of the house (``pagesift.core.ha.rolestate``,
``pagesift.core.ha.electorstate``, ``pagesift.core.replication.senderstate``,
``pagesift.core.replication.followerstate``) is a pure function ``step(state, event,
now) -> (state, actions)`` over a frozen state. Its events and actions are small
immutable values, declared here the same way for all four:

    EVENTS = Kinds("a sender event")

    @declare(EVENTS)
    class SessionClosed:
        session: int

    @declare(EVENTS)
    class Tick: ...  # (no fields)

    Event = SessionOpened | SessionClosed | Tick | ...
    EVENTS.seal(Event)

The protocol
------------
- ``declare(kinds)`` makes the class a frozen, slotted dataclass (positional or
  keyword arguments, ``match`` patterns by position, equality by value) and adds it to
  ``kinds``, in declaration order. ``typing.dataclass_transform`` tells the type
  checker so: the generated ``__init__`` and the frozen fields are checked.
- The machine names its ``Event`` / ``Action`` union by hand (the type checker needs a
  static union: the shells' ``match`` statements end in ``assert_never``), and
  ``seal(union)`` checks at import time that the union holds exactly the kinds
  declared: a message declared but left out of the union, or named in the union but
  declared some other way, fails the import (``TypeError``). After ``seal`` nothing
  more may be declared into it.
- ``kinds.declared``: the classes, for the tests that check a shell carries out every
  action of its machine.

The guarantee, and why it holds
-------------------------------
A message never changes once made (frozen, no ``__dict__``), so a state or an action
list that holds one can be shared, compared and replayed freely; and each machine's
union, the type its ``step`` and its shell's dispatch are checked against, is its
complete list of messages. No I/O, no clock: a pure module, importable by the pure
machines (``tests/test_layers.py``'s ``PURE``).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


class Kinds:
    """The events, or the actions, of one machine, in the order they were declared."""

    __slots__ = ("_declared", "_sealed", "what")

    def __init__(self, what: str) -> None:
        self.what = what  # e.g. "a sender event": names the kind in errors
        self._declared: list[type] = []
        self._sealed = False

    @property
    def declared(self) -> tuple[type, ...]:
        return tuple(self._declared)

    def add(self, cls: type) -> None:
        if self._sealed:
            raise TypeError(f"{cls.__qualname__}: {self.what} declared after the union")
        self._declared.append(cls)

    def seal(self, union: object) -> None:
        """Check that ``union`` (``A | B | ...``, or one class) is exactly the kinds
        declared; nothing may be declared after."""
        members = typing.get_args(union) if isinstance(union, types.UnionType) else (union,)
        missing = [c.__qualname__ for c in self._declared if c not in members]
        foreign = [getattr(m, "__qualname__", repr(m)) for m in members if m not in self._declared]
        if missing or foreign:
            raise TypeError(
                f"the union of {self.what}s does not match its declarations: "
                f"declared but not in the union {missing}, in it but not declared {foreign}"
            )
        self._sealed = True

    def unknown(self, message: object) -> TypeError:
        """The error a ``step`` raises for a value that is none of its kinds."""
        return TypeError(f"not {self.what}: {message!r}")


@dataclass_transform(frozen_default=True)
def declare(kinds: Kinds) -> Callable[[type[T]], type[T]]:
    """Make the decorated class a frozen, slotted dataclass, one of ``kinds``."""

    def make(cls: type[T]) -> type[T]:
        made = dataclass(frozen=True, slots=True)(cls)
        kinds.add(made)
        return made

    return make
