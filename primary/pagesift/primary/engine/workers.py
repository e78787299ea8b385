"""The node's pool of extraction worker processes: who runs what, for how long, in how much memory.

Owns the worker processes a node uses for CPU-heavy work on untrusted bytes (HTML
extraction, document conversion; ``pages.PageMaker`` calls ``WorkerPool.call``): their
lazy start (no process until the first call), which call each one runs, the order in
which waiting calls get a worker, the kill of a worker a call outlived, the
replacement of a worker that died or grew too big, and their shutdown. What runs
inside a worker, and the frames it speaks, are ``workerproc``'s. The guarantees:

- **A call's failure is charged to that call only.** The pool knows which process
  runs which call, so a crash, a memory exhaustion or a deadline kill ends one worker
  and fails exactly the call it was running (``WorkerCrashed``, ``WorkerOutOfMemory``,
  ``WorkerTimeout``: each a ``WorkerLost`` naming the cause). A worker that dies
  *before* it acknowledged a call did not die of that call's input: the call is sent
  again, once, to a fresh worker (``charged=False`` if that one dies first too).
- **Deadlines and memory.** A call with a ``timeout`` is SIGKILLed through a pidfd
  (no pid reuse) when it outlives it, counted once the call is on its worker
  (queueing is not the call's fault); ``Limits`` bound each worker's address space
  and CPU, and a worker whose peak memory in a call passed ``recycle_rss_bytes`` is
  retired after it, so no worker keeps what a big page made it grow to.
- **Fair between owners.** Waiting calls queue per owner (an account) and a freed
  worker goes to the owners in turn, one call each, sent in the same step that frees
  it (the worker does not idle while the caller's task wakes up).
- After ``close`` no process is started again; every worker is SIGKILLed and the
  calls in flight or waiting raise ``PoolClosed``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import multiprocessing
import os
import pickle
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pagesift.primary.engine.workerproc import HEADER, worker_main

__all__ = [
    "Limits",
    "Outcome",
    "PoolClosed",
    "WorkerCrashed",
    "WorkerLost",
    "WorkerOutOfMemory",
    "WorkerPool",
    "WorkerTimeout",
    "describe_bytes",
    "worker_count",
]

T = TypeVar("T")

MAX_FRAME_BYTES = 1 << 30  # a reply longer than this is treated as a broken worker
START_TIMEOUT = 60.0  # seconds a new worker may take to say "ready"
REAP_TIMEOUT = 5.0  # seconds to wait for a dead worker's exit status


class WorkerLost(Exception):
    """The call's worker died or was killed (or the pool is closed). ``charged``:
    the death was the call's own doing (it had started in that worker)."""

    cause = "lost"

    def __init__(self, message: str, *, charged: bool = True) -> None:
        super().__init__(message)
        self.charged = charged


class WorkerCrashed(WorkerLost):
    """The worker died during the call: a signal (SIGSEGV, SIGABRT, SIGXCPU, a
    SIGKILL from outside such as the kernel's OOM killer) or an exit."""

    cause = "crashed"


class WorkerOutOfMemory(WorkerLost):
    """The call ran out of the worker's address space (``RLIMIT_AS``)."""

    cause = "memory"


class WorkerTimeout(WorkerLost):
    """The call outlived its timeout; its worker was killed."""

    cause = "deadline"


class PoolClosed(WorkerLost):
    """The pool was closed before or during the call (the node is stopping)."""

    cause = "closed"

    def __init__(self, message: str = "the worker pool is closed") -> None:
        super().__init__(message, charged=False)


@dataclass(frozen=True, slots=True)
class Limits:
    """What each worker may use. 0 turns a limit off."""

    memory_bytes: int = 2 << 30  # RLIMIT_AS of each worker (config: worker_memory_limit)
    recycle_rss_bytes: int = 384 << 20  # retire a worker whose peak RSS in a call passed it
    # CPU seconds past a call's timeout after which RLIMIT_CPU ends the worker (the
    # backstop for a node whose loop cannot kill it); the limit is whole seconds
    cpu_margin_seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """A call's result and what it cost in its worker."""

    value: T
    peak_rss_bytes: int  # the worker's peak resident memory during the call
    seconds: float  # wall time from sending the call to its reply
    pid: int  # the worker that ran it


def worker_count(setting: int) -> int:
    """Worker processes for an ``extract_processes`` setting: -1 (or any negative
    number) means one per CPU, 0 means none (work is done in a thread)."""
    if setting < 0:
        return os.cpu_count() or 1
    return setting


def describe_bytes(n: int) -> str:
    """``n`` bytes for a message: 1 GiB, 384 MiB, 1000 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


# --- the worker side ---------------------------------------------------------------------


# --- the pool ----------------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    proc: Any  # multiprocessing's ForkServerProcess (kept: it holds the node's sentinel end)
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pid: int
    pidfd: int
    calls: int = 0
    killed: str = ""  # why the node killed it ("" when it did not)
    dead: bool = False  # its process is gone (or going)
    forgotten: bool = False  # the pool dropped it

    def kill(self, why: str) -> None:
        """SIGKILL the process (through its pidfd), once; ``why`` names the cause."""
        if not self.killed:
            self.killed = why
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)


@dataclass
class _Waiter:
    future: asyncio.Future[_Worker]
    owner: str
    payload: bytes  # the call, sent the moment a worker is assigned to it


@dataclass
class _Queues:
    """Calls waiting for a worker, per owner, served round robin."""

    by_owner: collections.OrderedDict[str, collections.deque[_Waiter]] = field(
        default_factory=collections.OrderedDict
    )

    def push(self, waiter: _Waiter) -> None:
        self.by_owner.setdefault(waiter.owner, collections.deque()).append(waiter)

    def pop(self) -> _Waiter | None:
        """The next waiter: the first owner in turn's oldest call; that owner goes to
        the back of the turn."""
        while self.by_owner:
            owner, queue = next(iter(self.by_owner.items()))
            waiter = queue.popleft()
            if queue:
                self.by_owner.move_to_end(owner)
            else:
                del self.by_owner[owner]
            if not waiter.future.done():
                return waiter
        return None

    def remove(self, waiter: _Waiter) -> None:
        queue = self.by_owner.get(waiter.owner)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
            if not queue:
                del self.by_owner[waiter.owner]

    def waiting(self) -> int:
        return sum(len(q) for q in self.by_owner.values())


class _NotStarted(Exception):
    """The worker died before it acknowledged the call."""


class WorkerPool:
    """Up to ``processes`` worker processes (at least 1), started on first use, each
    under ``limits``; ``preload`` names modules the forkserver imports once."""

    def __init__(
        self,
        processes: int,
        limits: Limits = Limits(),
        *,
        preload: Sequence[str] = (),
    ) -> None:
        if processes < 1:
            raise ValueError("a worker pool needs at least one process")
        self.processes = processes
        self.limits = limits
        self._preload = list(preload)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0  # workers being started (counted against ``processes``)
        self._queues = _Queues()
        self._closed = False
        # figures (read by metrics and tests)
        self.deaths: collections.Counter[str] = collections.Counter()  # by cause
        self.recycled = 0  # workers retired for their peak memory
        self.started = 0  # worker processes started

    # --- public ---------------------------------------------------------------------------

    async def run(
        self, fn: Callable[..., T], *args: object, timeout: float | None = None, owner: str = ""
    ) -> T:
        """``fn(*args)`` in a worker process; its value (see ``call``)."""
        return (await self.call(fn, *args, timeout=timeout, owner=owner)).value

    async def call(
        self, fn: Callable[..., T], *args: object, timeout: float | None = None, owner: str = ""
    ) -> Outcome[T]:
        """``fn(*args)`` in a worker process (``fn`` and the arguments are pickled: a
        module-level function), for ``owner`` (fair share between owners). An
        exception ``fn`` raises is raised here. With ``timeout`` (seconds, counted
        once the call reaches its worker), a call not done in time has its worker
        killed and raises ``WorkerTimeout``. ``WorkerCrashed``/``WorkerOutOfMemory``:
        the worker died of, or ran out of memory on, this call; ``PoolClosed``."""
        cpu = None if timeout is None else timeout + self.limits.cpu_margin_seconds
        payload = pickle.dumps((fn, args, cpu))
        for attempt in range(2):
            worker = await self._acquire(owner, payload)
            try:
                return await self._exchange(worker, timeout)
            except _NotStarted as exc:
                if self._closed:
                    raise PoolClosed() from None
                if attempt == 1:
                    raise WorkerCrashed(
                        f"two workers died before starting the call ({exc})", charged=False
                    ) from None
            finally:
                self._release(worker)
        raise AssertionError("unreachable")  # pragma: no cover

    def busy(self) -> int:
        """Workers running a call now."""
        return len(self._busy)

    def waiting(self) -> int:
        """Calls waiting for a worker now."""
        return self._queues.waiting()

    def pids(self) -> list[int]:
        """The live workers' process ids (idle and busy)."""
        return sorted(w.pid for w in (*self._idle, *self._busy) if not w.dead)

    def close(self) -> None:
        """Stop the pool: every worker is SIGKILLed, calls in flight and waiting raise
        ``PoolClosed``. Idempotent; the pool is not reopened."""
        self._closed = True
        for waiter in list(self._queues.by_owner.values()):
            for w in waiter:
                if not w.future.done():
                    w.future.set_exception(PoolClosed())
        self._queues.by_owner.clear()
        for worker in [*self._idle, *self._busy]:
            worker.kill("the pool is closed")
            self._forget(worker, reap=False)  # the forkserver reaps; the loop may be ending
        self._idle.clear()

    # --- scheduling -----------------------------------------------------------------------

    async def _acquire(self, owner: str, payload: bytes) -> _Worker:
        """A worker for the call, which has been sent to it."""
        if self._closed:
            raise PoolClosed()
        if self._idle and not self._queues.by_owner:
            worker = self._idle.pop()
            self._assign(worker, payload)
            return worker
        waiter = _Waiter(asyncio.get_running_loop().create_future(), owner, payload)
        self._queues.push(waiter)
        self._fill()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                if waiter.future.exception() is None:
                    worker = waiter.future.result()
                    worker.kill("the call was cancelled")  # it was sent: it may be running
                    self._release(worker)
            else:
                self._queues.remove(waiter)
            raise

    def _assign(self, worker: _Worker, payload: bytes) -> None:
        """``worker`` is busy with the call ``payload``, written to it now (in the same
        step that freed it: the worker does not wait for the caller's task to wake)."""
        self._busy.add(worker)
        worker.writer.write(HEADER.pack(len(payload)))
        worker.writer.write(payload)

    def _fill(self) -> None:
        """Hand idle workers to waiters in turn; start workers for the rest, up to
        ``processes``."""
        while self._idle and self._queues.by_owner:
            waiter = self._queues.pop()
            if waiter is None:
                break
            worker = self._idle.pop()
            self._assign(worker, waiter.payload)
            waiter.future.set_result(worker)
        live = len(self._idle) + len(self._busy) + self._starting
        want = min(self._queues.waiting(), self.processes - live)
        for _ in range(max(0, want)):
            self._starting += 1
            task = asyncio.get_running_loop().create_task(self._start_one())
            task.add_done_callback(_retrieve)

    def _release(self, worker: _Worker) -> None:
        """The call on ``worker`` is over: back to the pool, or gone if it died,
        was killed, or grew past the recycle threshold."""
        self._busy.discard(worker)
        if worker.dead or worker.killed or self._closed:
            self._forget(worker)
        else:
            self._idle.append(worker)
        if not self._closed:
            self._fill()

    async def _start_one(self) -> None:
        try:
            worker = await self._spawn()
        except Exception as exc:
            self._starting -= 1
            self.deaths["start"] += 1
            waiter = self._queues.pop()
            if waiter is not None:
                waiter.future.set_exception(
                    WorkerCrashed(f"a worker could not start: {exc}", charged=False)
                )
            return
        self._starting -= 1
        if self._closed:
            worker.kill("the pool is closed")
            self._forget(worker)
            return
        self._idle.append(worker)
        self._fill()

    async def _spawn(self) -> _Worker:
        ctx = multiprocessing.get_context("forkserver")
        if self._preload:
            ctx.set_forkserver_preload(self._preload)  # used if the forkserver starts now
        ours, theirs = socket.socketpair()
        try:
            proc = ctx.Process(  # type: ignore[attr-defined]
                target=worker_main,
                args=(theirs, self.limits.memory_bytes),
                name="pagesift-worker",
            )
            # Off the loop (the node's first start waits for the forkserver to import
            # the preload modules), in the one thread that does all of this module's
            # multiprocessing bookkeeping: Process.start polls every child's sentinel
            # (multiprocessing's _cleanup), which must not race another poll of it.
            await _in_mp_thread(proc.start)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.started += 1
        pid = proc.pid
        assert pid is not None  # started
        pidfd = -1
        try:
            pidfd = os.pidfd_open(pid)
            reader, writer = await asyncio.open_connection(sock=ours, limit=1 << 16)
        except BaseException:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            if pidfd >= 0:
                os.close(pidfd)
            ours.close()
            raise
        worker = _Worker(proc, reader, writer, pid, pidfd)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                hello = pickle.loads(await _read_frame(reader))
            if hello != ("ready", pid):
                raise RuntimeError(f"unexpected greeting {hello!r:.80}")
        except BaseException:
            worker.kill("it did not start")
            self._forget(worker)
            raise
        return worker

    def _forget(self, worker: _Worker, *, reap: bool = True) -> None:
        """Drop a worker for good: its socket closed (an idle worker exits on the EOF),
        its exit status collected in the background (with ``reap``), its pidfd closed.
        Its process is the forkserver's child: the forkserver reaps it either way."""
        self._busy.discard(worker)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)
        if worker.forgotten:
            return
        worker.forgotten = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to flush
            worker.writer.close()
        if reap:
            with contextlib.suppress(RuntimeError):  # no running loop: the loop is gone
                task = asyncio.get_running_loop().create_task(_reap(worker))
                task.add_done_callback(_retrieve)
                return
        _close_pidfd(worker)

    # --- one call ---------------------------------------------------------------------------

    async def _exchange(self, worker: _Worker, timeout: float | None) -> Outcome[Any]:
        started = time.monotonic()
        stage = ["sending"]
        try:
            async with asyncio.timeout(timeout):
                reply = await _converse(worker, stage)
        except TimeoutError:
            worker.kill("deadline")
            self.deaths["deadline"] += 1
            raise WorkerTimeout(f"it took over {timeout:g} s; its worker was killed") from None
        except asyncio.CancelledError:
            worker.kill("the call was cancelled")  # it may be anywhere in a long call
            raise
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
            worker.dead = True
            cause = await self._death(worker, exc)
            if stage[0] != "running":
                self.deaths["unstarted"] += 1
                raise _NotStarted(cause) from None
            if self._closed:
                raise PoolClosed() from None
            self.deaths["crashed"] += 1
            raise WorkerCrashed(f"the worker died on it ({cause})") from None
        seconds = time.monotonic() - started
        try:
            kind, value, peak = pickle.loads(reply)
        except Exception as exc:
            worker.kill("it sent an unreadable reply")
            self.deaths["crashed"] += 1
            raise WorkerCrashed(f"its worker sent an unreadable reply: {exc}") from None
        worker.calls += 1
        if kind == "memory":
            worker.dead = True  # it exits after a MemoryError
            self.deaths["memory"] += 1
            cap = describe_bytes(self.limits.memory_bytes)
            raise WorkerOutOfMemory(f"it needed more than the worker memory cap ({cap})")
        if self.limits.recycle_rss_bytes and peak >= self.limits.recycle_rss_bytes:
            self.recycled += 1
            worker.kill("recycled")
        if kind == "error":
            raise value
        return Outcome(value, int(peak), seconds, worker.pid)

    async def _death(self, worker: _Worker, exc: BaseException) -> str:
        """Why ``worker`` is gone, from its exit status (waited for, bounded)."""
        code = await _exit_status(worker.proc, REAP_TIMEOUT)
        if code is None:
            return f"its connection broke: {type(exc).__name__}"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            if -code == signal.SIGXCPU:
                return f"{name}: its CPU time limit"
            if -code == signal.SIGKILL and worker.killed:
                return f"{name}: {worker.killed}"
            return name
        return f"exit status {code}"


async def _converse(worker: _Worker, stage: list[str]) -> bytes:
    """Finish sending the call (``_assign`` wrote it), read the acknowledgement
    (``stage[0]`` becomes "running") and the reply frame. A dead worker surfaces as
    ConnectionError/IncompleteReadError."""
    await worker.writer.drain()
    if pickle.loads(await _read_frame(worker.reader)) != ("started",):
        worker.kill("it broke the protocol")
        raise ConnectionError("the worker broke the protocol")
    stage[0] = "running"
    return await _read_frame(worker.reader)


_mp_executor: concurrent.futures.ThreadPoolExecutor | None = None


async def _in_mp_thread(fn: Callable[[], T]) -> T:
    """``fn()`` in the one thread that starts worker processes and reads their exit
    status (every ``multiprocessing`` call on a ``Process`` of this module goes there:
    reads of a sentinel must not race each other, and a start can block)."""
    global _mp_executor
    if _mp_executor is None:
        _mp_executor = concurrent.futures.ThreadPoolExecutor(1, "pagesift-workers")
    return await asyncio.get_running_loop().run_in_executor(_mp_executor, fn)


def _exitcode(proc: Any) -> int | None:
    code = proc.exitcode
    return None if code is None else int(code)


async def _exit_status(proc: Any, timeout: float) -> int | None:
    """``proc``'s exit status once its sentinel says it ended (None after ``timeout``):
    waited for on the loop (the sentinel turns readable), read in the mp thread."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    fd = proc.sentinel

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, readable)
    try:
        async with asyncio.timeout(timeout):
            await ended
    except TimeoutError:
        return None
    finally:
        loop.remove_reader(fd)
    return await _in_mp_thread(functools.partial(_exitcode, proc))


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if n > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {n} bytes")
    return await reader.readexactly(n)


async def _reap(worker: _Worker) -> None:
    """Collect a retired worker's exit status (SIGKILL it if it lingers), then let go
    of its ``Process`` (its sentinel and the node's end of the parent pipe)."""
    try:
        if await _exit_status(worker.proc, REAP_TIMEOUT) is None:
            worker.kill("it did not exit when retired")
            await _exit_status(worker.proc, REAP_TIMEOUT)
        await _in_mp_thread(functools.partial(_close_if_ended, worker.proc))
    finally:
        _close_pidfd(worker)


def _close_if_ended(proc: Any) -> None:
    """Let go of an ended ``Process`` (its sentinel, the node's end of its parent pipe)."""
    if proc.exitcode is not None:
        proc.close()


def _close_pidfd(worker: _Worker) -> None:
    if worker.pidfd >= 0:
        with contextlib.suppress(OSError):
            os.close(worker.pidfd)
        worker.pidfd = -1


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
