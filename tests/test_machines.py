"""One step style for every state machine, and every action carried out by its shell.

- ``pagesift.core.util.machine``: ``declare`` makes frozen, slotted message classes and
  records them; ``seal`` refuses a union that is not exactly the kinds declared.
- The four machines (role, elector, sender, follower) declare their events and actions
  that way, each union sealed over them.
- The sender's and the follower's states are values: a step never changes the state
  it was given, and nothing in a state can be assigned.
- Each shell names every action of its machine in its dispatch (read from its source:
  the ``case`` patterns of the functions that carry the actions out), and the sender's
  shell refuses, loudly, an action its caller would leave undone. The scan is seen to
  report a shell that forgets one.
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from pathlib import Path

import pytest

from pagesift.core.ha import electorstate, rolestate
from pagesift.core.replication import followerstate, senderstate
from pagesift.core.replication.slot import open_slot
from pagesift.core.util.machine import Kinds, declare
from pagesift.primary.replication import ReplicationServicer

ROOT = Path(__file__).resolve().parent.parent
MACHINES = (rolestate, electorstate, senderstate, followerstate)


# --- the convention -------------------------------------------------------------------
def test_declare_makes_a_frozen_slotted_message_and_records_it_in_order() -> None:
    kinds = Kinds("a test event")

    @declare(kinds)
    class Opened:
        session: int
        peer: str = ""

    @declare(kinds)
    class Closed:
        """No fields."""

    assert kinds.declared == (Opened, Closed)
    opened = Opened(1, peer="b")
    assert opened == Opened(session=1, peer="b") and opened != Opened(2, "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opened.session = 2  # type: ignore[misc]
    assert not hasattr(opened, "__dict__") and vars(Opened)["__slots__"] == ("session", "peer")
    match opened:
        case Opened(session, peer):
            assert (session, peer) == (1, "b")
        case _:
            pytest.fail("positional patterns")
    assert str(kinds.unknown(3)) == "not a test event: 3"


def test_seal_refuses_a_union_that_is_not_exactly_the_kinds_declared() -> None:
    kinds = Kinds("a test action")

    @declare(kinds)
    class A:
        pass

    @declare(kinds)
    class B:
        pass

    @dataclasses.dataclass(frozen=True)
    class Stray:
        pass

    with pytest.raises(TypeError, match=r"declared but not in the union \['.*B'\]"):
        kinds.seal(A)
    with pytest.raises(TypeError, match=r"in it but not declared \['.*Stray'\]"):
        kinds.seal(A | B | Stray)
    kinds.seal(B | A)  # the order of the union does not matter
    with pytest.raises(TypeError, match="declared after the union"):

        @declare(kinds)
        class Late:
            pass


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.__name__)
def test_every_machine_declares_its_messages_by_the_convention(machine: types.ModuleType) -> None:
    for kinds, union in ((machine.EVENTS, machine.Event), (machine.ACTIONS, machine.Action)):
        assert set(kinds.declared) == set(typing.get_args(union))
        for cls in kinds.declared:
            params = cls.__dataclass_params__
            assert params.frozen and "__slots__" in cls.__dict__, cls


# --- states are values ------------------------------------------------------------------
def test_a_sender_step_leaves_the_state_it_was_given_as_it_was() -> None:
    s0 = senderstate.SenderState(senderstate.SenderConfig(mode="sync", failsafe_ttl=1.0))
    events: list[senderstate.Event] = [
        senderstate.SessionOpened(1, "b", "peer", 0),
        senderstate.SessionTailing(1),
        senderstate.WaitStarted(7, 3),
        senderstate.EntriesSent(1),
        senderstate.TailTurnEnded(1, sent=False),
        senderstate.AckReceived(1, 3, last_offset=3, grant=1),
        senderstate.WaitStarted(8, 4),
        senderstate.Tick(),
        senderstate.SessionClosed(1),
    ]
    state, seen = s0, []
    for i, event in enumerate(events):
        before = repr(state)
        nxt, _ = senderstate.step(state, event, 2.0 * i)
        assert repr(state) == before, f"{event!r} changed the state it was given"
        seen.append(nxt)
        state = nxt
    assert seen[-1].degraded and seen[-1].grants_confirmed == 1  # the steps did happen
    session = seen[2].sessions[1]
    with pytest.raises(TypeError):
        seen[2].sessions[2] = session  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        session.acked = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[2].pending = ()  # type: ignore[misc]


def test_a_follower_step_leaves_the_state_it_was_given_as_it_was() -> None:
    f0 = followerstate.FollowerState(caught_up_at=0.0)
    events: list[followerstate.Event] = [
        followerstate.SessionSynced(),
        followerstate.EntriesApplied(3, applied=3),
        followerstate.NextMessage(buffered=False),
        followerstate.HeartbeatReceived(5, 1000, 0.5, applied=3, grant=2),
        followerstate.SnapshotInstalled(9, applied=9),
        followerstate.NextMessage(buffered=False),
    ]
    state = f0
    for i, event in enumerate(events):
        before = repr(state)
        nxt, _ = followerstate.step(state, event, float(i))
        assert repr(state) == before, f"{event!r} changed the state it was given"
        state = nxt
    assert state.primary_offset == 9 and not state.owed and state.last_ack == 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.owed = True  # type: ignore[misc]


# --- every action carried out by its shell ------------------------------------------------
def _classes(tree: ast.AST) -> set[str]:
    """The class names the ``case`` patterns in ``tree`` name (``A()``, ``m.A(...)``, in
    or-patterns and nested ones)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.MatchClass):
            cls = node.cls
            names.add(cls.attr if isinstance(cls, ast.Attribute) else ast.unparse(cls))
    return names


def _functions(source: str, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function called ``name`` in ``source``, whatever class holds it."""
    return [
        fn
        for fn in ast.walk(ast.parse(source))
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name == name
    ]


def _cases(source: str, functions: tuple[str, ...]) -> dict[str, set[str]]:
    """function -> the class names its ``case`` patterns name."""
    return {f: set().union(*map(_classes, _functions(source, f))) for f in functions}


def _passed_back(source: str, function: str) -> set[str]:
    """The class names of ``function``'s cases whose body only hands the action back
    (``rest.append(action)``): actions another function of the shell must carry out."""
    names: set[str] = set()
    for fn in _functions(source, function):
        for case in (n for n in ast.walk(fn) if isinstance(n, ast.match_case)):
            if len(case.body) == 1 and ast.unparse(case.body[0]).endswith(".append(action)"):
                names |= _classes(case.pattern)
    return names


def _unhandled(machine: types.ModuleType, source: str, dispatch: tuple[str, ...]) -> list[str]:
    named = set().union(*_cases(source, dispatch).values())
    return sorted(c.__name__ for c in machine.ACTIONS.declared if c.__name__ not in named)


SHELLS = [
    (rolestate, "shared/pagesift/node/node.py", ("_carry_out",)),
    (electorstate, "shared/pagesift/node/elector.py", ("_carry_out",)),
    (senderstate, "primary/pagesift/primary/replication.py", ("_carry_out",)),
    (followerstate, "standby/pagesift/standby/follower.py", ("_carry_out",)),
]


@pytest.mark.parametrize(
    ("machine", "shell", "dispatch"), SHELLS, ids=[m.__name__.rsplit(".")[-1] for m, *_ in SHELLS]
)
def test_every_shell_dispatch_names_every_action_of_its_machine(
    machine: types.ModuleType, shell: str, dispatch: tuple[str, ...]
) -> None:
    assert _unhandled(machine, (ROOT / shell).read_text(), dispatch) == []


def test_the_sender_shell_carries_out_every_action_it_hands_back() -> None:
    """``_carry_out`` hands a waiter's and the tail's actions back: ``wait_replicated``
    and ``_tail`` name each of them."""
    source = (ROOT / "primary/pagesift/primary/replication.py").read_text()
    back = _passed_back(source, "_carry_out")
    assert back == {
        "Release",
        "AwaitAck",
        "SendEntries",
        "Linger",
        "SendHeartbeat",
        "WaitForEntries",
    }
    callers = _cases(source, ("wait_replicated", "_tail"))
    assert back <= callers["wait_replicated"] | callers["_tail"]


def test_the_scan_reports_a_shell_that_forgets_an_action() -> None:
    source = (ROOT / "standby/pagesift/standby/follower.py").read_text()
    forgetful = source.replace("case SendAck(grant):", "case None:")
    assert forgetful != source
    assert _unhandled(followerstate, forgetful, ("_carry_out",)) == ["SendAck"]
    sender = (ROOT / "primary/pagesift/primary/replication.py").read_text()
    dropped = sender.replace("case WaitForEntries(until):", "case None:")
    assert dropped != sender
    callers = _cases(dropped, ("wait_replicated", "_tail"))
    assert "WaitForEntries" not in callers["wait_replicated"] | callers["_tail"]


def test_the_sender_shell_refuses_an_action_left_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = open_slot(tmp_path / "a", backlog_bytes=1 << 20)
    try:
        repl = ReplicationServicer(slot, node_id="a")
        machine_step = senderstate.step

        def one_more(
            state: senderstate.SenderState, event: senderstate.Event, now: float
        ) -> tuple[senderstate.SenderState, list[senderstate.Action]]:
            state, actions = machine_step(state, event, now)
            return state, [*actions, senderstate.SendHeartbeat()]

        repl._step_done(senderstate.SessionOpened(1, "b", "peer", 0))  # the real machine
        monkeypatch.setattr(senderstate, "step", one_more)
        with pytest.raises(RuntimeError, match="went undone"):
            repl._step_done(senderstate.SessionTailing(1))
        assert repl._sender.sessions[1].tailing  # the state the step returned was kept
    finally:
        slot.close()
