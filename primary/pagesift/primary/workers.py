"""The node's pool of extraction worker processes, and their lifetime.

Owns the one ``ProcessPoolExecutor`` a node uses for CPU-heavy work (HTML
extraction, document conversion): its creation (lazy: no process starts until
the first call), the initializer every worker runs, the replacement of a pool a
dead worker broke, the kill of a pool a call outlived, and its shutdown.
``fetch.HttpEngine`` only calls ``WorkerPool.run``.

Guarantees:

- **No worker outlives its node**, however the node ends (SIGKILL, SIGTERM,
  a crash, a normal exit): a worker exits within moments of its node's death,
  and with the workers gone the forkserver and the resource tracker exit too.
  The bound is the current Python instruction: a worker busy in one long C call
  that holds the GIL exits when that call returns (one page's extraction).
- Workers are never forked from the node: the ``forkserver`` start method forks
  them from a small single-threaded server process, never from a process with
  gRPC/asyncio threads (forking those can deadlock the child).
- A worker that dies mid-task breaks only that call: ``run`` raises
  ``WorkerLost`` (the caller does the work inline) and the next call gets a
  fresh pool. After ``close`` no process is started again.
- ``run(..., timeout=T)`` returns or raises within about ``T`` seconds even when
  the worker is stuck (in C code that never returns, say): on timeout every
  process of the pool is SIGKILLed (the executor cannot tell which worker holds
  which call), the pool is dropped, and ``run`` raises ``WorkerTimeout``; other
  calls in flight on that pool raise ``WorkerLost``, and the next call gets a
  fresh pool. ``WorkerTimeout`` is not a ``WorkerLost``: work that timed out must
  not be redone inline.

Why processes used to outlive a SIGKILLed node (CPython 3.11's multiprocessing):
the forkserver exits when every holder of the write end of its "alive" pipe is
gone, but each worker it forks inherits that write end; the resource tracker
exits when every holder of its pipe is gone, and each worker holds it too; and
a worker idles in ``call_queue.get()`` on a queue whose write end it also holds,
so it never sees EOF. Nothing told the workers that the node died, so all three
kinds of process waited on each other forever.

The fix, and why it is safe: each worker runs a watcher thread (started by the
pool's initializer) that blocks on ``multiprocessing.parent_process().sentinel``
and ``os._exit``\\ s when it reads EOF. That sentinel is the read end of a pipe
whose only write end is kept open by the node, for the worker's whole life,
inside the node's ``Popen`` object; the kernel closes it when the node dies by
any cause, so EOF means exactly "the node is gone": no pid is watched (no pid
reuse race), nothing polls, and a node that died before the watcher started is
seen at once. Once the workers are gone, the last holders of the forkserver's
and the tracker's pipes are gone and both exit on their own. Alternatives
considered: ``prctl(PR_SET_PDEATHSIG)`` fires on the death of the parent
*thread*, and a forkserver worker's parent is the forkserver, not the node;
``os.pidfd_open(node_pid)`` in the worker races with pid reuse if the node died
before the worker started; the ``spawn`` start method plus PDEATHSIG would tie
worker lifetime to whichever node thread spawned them.

Workers ignore SIGINT: a Ctrl-C on the terminal reaches the whole process
group, and the node, which handles it, decides when its workers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

__all__ = ["WorkerLost", "WorkerPool", "WorkerTimeout", "worker_count"]

T = TypeVar("T")

# Exit status of a worker that saw its node die (no one reads it: the node is gone).
NODE_GONE_EXIT = 70
_DRAIN_MAX_READS = 1 << 20  # the node writes no more than the worker's start data


class WorkerLost(Exception):
    """A worker process died during the call (or the pool is closed)."""


class WorkerTimeout(Exception):
    """The call outlived its timeout; the pool's workers were killed."""


def worker_count(setting: int) -> int:
    """Worker processes for an ``extract_processes`` setting: -1 (or any negative
    number) means one per CPU, 0 means none (work is done inline)."""
    if setting < 0:
        return os.cpu_count() or 1
    return setting


def _exit_when_node_dies(sentinel: int) -> None:
    """Block until the node's end of ``sentinel`` closes, then end this process."""
    # Blocking reads: EOF ("" from os.read) once the node's write end is closed.
    # Bytes the worker's start-up left unread (there should be none) are drained.
    for _ in range(_DRAIN_MAX_READS):
        try:
            if not os.read(sentinel, 65536):
                break
        except InterruptedError:  # pragma: no cover - PEP 475 retries reads
            continue
        except OSError:
            break  # the descriptor is unusable: the watch cannot be kept, fail closed
    os._exit(NODE_GONE_EXIT)


def _init_worker() -> None:
    """Runs first in every worker: tie its lifetime to the node's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is None:  # pragma: no cover - only ever run inside a pool worker
        raise RuntimeError("pagesift worker started outside a process pool")
    watcher = threading.Thread(
        target=_exit_when_node_dies,
        args=(parent.sentinel,),
        name="pagesift-node-watch",
        daemon=True,
    )
    watcher.start()


class WorkerPool:
    """Up to ``processes`` worker processes (at least 1), started on first use."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError("a worker pool needs at least one process")
        self.processes = processes
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False

    def _executor_now(self) -> ProcessPoolExecutor:
        if self._closed:
            raise WorkerLost("the worker pool is closed")
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.processes,
                mp_context=multiprocessing.get_context("forkserver"),
                initializer=_init_worker,
            )
        return self._executor

    async def run(self, fn: Callable[..., T], *args: object, timeout: float | None = None) -> T:
        """``fn(*args)`` in a worker process (``fn`` and the arguments are pickled:
        a module-level function). Raises ``WorkerLost`` if the worker died first;
        the broken pool is dropped and the next call starts a new one. With
        ``timeout`` (seconds, counted from the call, queueing included), a call not
        done in time kills the pool's workers and raises ``WorkerTimeout``."""
        executor = self._executor_now()
        future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        try:
            if timeout is None:
                return await future
            return await asyncio.wait_for(future, timeout)
        except BrokenProcessPool as exc:
            self._drop(executor)
            raise WorkerLost(str(exc) or "a worker process died") from exc
        except TimeoutError as exc:
            self._drop(executor, kill=True)
            raise WorkerTimeout(f"{getattr(fn, '__name__', fn)!s} took over {timeout} s") from exc

    def _drop(self, executor: ProcessPoolExecutor, *, kill: bool = False) -> None:
        """Forget ``executor`` (if it is still the pool's) and shut it down; with
        ``kill``, SIGKILL its workers first (a stuck worker never reads a stop)."""
        if kill:
            # ProcessPoolExecutor has no public kill; its worker map is stable CPython API
            # since 3.2 (and typeshed's). The executor's manager thread sees the deaths
            # and fails the pool's other calls with BrokenProcessPool.
            for proc in list((executor._processes or {}).values()):
                with contextlib.suppress(OSError, ValueError):
                    proc.kill()
        if self._executor is executor:
            self._executor = None
        executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers (calls in flight are cancelled; an idle worker exits at
        once, a busy one after its call). Idempotent; the pool is not reopened."""
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
