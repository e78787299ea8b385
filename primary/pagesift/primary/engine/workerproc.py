"""The worker process: its main loop, the limits it runs under, and its tie to the node.

Owns what runs inside one extraction worker (``workers.WorkerPool`` starts them from
the ``forkserver``: never forked from the node, whose gRPC/asyncio threads could
deadlock a forked child) and the frames it speaks over its ``socketpair``: an 8-byte
big-endian length (``HEADER``) and a pickle:

- worker -> node ``("ready", pid)`` once, after its limits are set;
- node -> worker ``(fn, args, cpu_seconds)``; worker -> node ``("started",)`` once it
  has the call, then one reply ``(kind, value, peak_rss_bytes)``: ``kind`` is
  ``"ok"`` (``value`` the result), ``"error"`` (``value`` the exception ``fn`` raised)
  or ``"memory"`` (``fn`` ran out of its address space: the worker exits after it);
- the node closes its end (or the node dies): the worker reads EOF and exits.

The invariants: the operating system enforces the limits (``RLIMIT_AS`` for memory,
a ``RLIMIT_CPU`` soft limit moved before each call to the CPU time used plus the
call's budget, the backstop should the node's loop be too stuck to kill it); the
peak resident memory reported is that of the call alone (``VmHWM``, reset first);
a reply always goes back (an exception that cannot be pickled becomes a
``RuntimeError`` naming it); and no worker outlives its node, however the node ends
(``_watch_node``). Workers ignore SIGINT: a Ctrl-C on the terminal reaches the whole
process group, and the node decides when its workers stop.

Trust: replies are unpickled in the node. A worker runs only this package's code on
untrusted *data*; a worker whose memory an exploit of a C parser took over could
send a hostile pickle.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import resource
import signal
import socket
import struct
import threading

__all__ = ["HEADER", "NODE_GONE_EXIT", "worker_main"]

# Exit status of a worker that saw its node die (no one reads it: the node is gone).
NODE_GONE_EXIT = 70
_DRAIN_MAX_READS = 1 << 20  # the node writes no more than the worker's start data
HEADER = struct.Struct("!Q")  # a frame's length, before its pickle


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


def _watch_node() -> None:
    """Runs first in every worker: tie its lifetime to the node's.

    A thread blocks on ``multiprocessing.parent_process().sentinel`` and ends the
    process at EOF. That sentinel is the read end of a pipe whose only write end the
    node keeps open, for the worker's whole life, inside its ``Popen`` object (the
    pool keeps each worker's ``Process`` until the worker is gone); the kernel closes
    it when the node dies by any cause, so EOF means exactly "the node is gone": no
    pid is watched (no pid reuse race), nothing polls, and a node that died before
    the watcher started is seen at once. With the workers gone, the forkserver and
    the resource tracker (whose pipes every worker inherits) lose their last holders
    and exit too. The bound is the current Python instruction: a worker busy in one
    long C call that holds the GIL exits when that call returns, or at its
    ``RLIMIT_CPU``. Not ``prctl(PR_SET_PDEATHSIG)``: it fires on the death of the
    parent *thread*, and a forkserver worker's parent is the forkserver; not
    ``os.pidfd_open(node_pid)``: it races with pid reuse if the node died first.
    """
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


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``, or None at EOF."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(HEADER.pack(len(payload)))
    sock.sendall(payload)


class _PeakRss:
    """This process's resident high-water mark (VmHWM), read and reset through two
    descriptors opened once (a call's two ``/proc`` files without an open and close
    each: ~35 us a call less). Opened in the worker itself, so ``/proc/self`` is it."""

    def __init__(self) -> None:
        self._status = self._clear = -1
        with contextlib.suppress(OSError):
            self._status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)

    def reset(self) -> None:
        """Reset VmHWM (Linux: ``clear_refs`` 5), so the next read is the peak of what
        runs in between; without it the peak is the process's lifetime one."""
        with contextlib.suppress(OSError):
            os.write(self._clear, b"5")

    def read(self) -> int:
        """VmHWM in bytes (the lifetime peak from ``getrusage`` if ``/proc`` fails)."""
        try:
            status = os.pread(self._status, 16384, 0)
            at = status.index(b"VmHWM:")
            return int(status[at + 6 : status.index(b"\n", at)].split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _cpu_used() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _set_cpu_limit(seconds: float | None) -> None:
    """RLIMIT_CPU's soft limit to the CPU time used so far plus ``seconds`` (None: no
    limit); the hard limit stays where it is, so the worker can move it each call."""
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if seconds is None:
        soft = hard
    else:
        soft = math.ceil(_cpu_used() + seconds)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def worker_main(sock: socket.socket, memory_bytes: int) -> None:
    """A worker's life: its limits (``memory_bytes`` of address space, 0: no cap),
    "ready", then one call at a time until EOF."""
    _watch_node()
    with contextlib.suppress(ValueError, OSError):  # no core files of a crash or SIGXCPU
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = memory_bytes
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    peak = _PeakRss()
    try:
        _send_frame(sock, pickle.dumps(("ready", os.getpid())))
        while True:
            header = _recv_exactly(sock, HEADER.size)
            body = None if header is None else _recv_exactly(sock, HEADER.unpack(header)[0])
            if body is None:
                break  # the node closed its end: retired, or the pool is closed
            frame, kind = _run_one(sock, body, peak)
            _send_frame(sock, frame)
            if kind == "memory":
                break  # its heap may be left fragmented or half-built: a fresh worker follows
    except OSError:
        pass  # the node's end closed mid-frame (a pool closed while this one started)
    os._exit(0)


def _run_one(sock: socket.socket, body: bytes, peak: _PeakRss) -> tuple[bytes, str]:
    """Acknowledge and run one call; its reply frame and kind. Never raises (but for
    the process's death)."""
    kind: str
    value: object
    try:
        fn, args, cpu_seconds = pickle.loads(body)
    except Exception as exc:
        fn, args, cpu_seconds = None, (), None
        value, kind = exc, "error"
    _set_cpu_limit(cpu_seconds)
    peak.reset()
    _send_frame(sock, pickle.dumps(("started",)))
    if fn is not None:
        try:
            value, kind = fn(*args), "ok"
        except MemoryError:
            value, kind = None, "memory"
        except BaseException as exc:
            value, kind = exc, "error"
    try:
        frame = pickle.dumps((kind, value, peak.read()))
        if kind == "error":
            pickle.loads(frame)  # an exception that pickles but cannot be rebuilt
        return frame, kind
    except MemoryError:
        return pickle.dumps(("memory", None, peak.read())), "memory"
    except Exception as exc:
        problem = RuntimeError(f"{type(value).__name__} could not be sent back: {exc}")
        return pickle.dumps(("error", problem, peak.read())), "error"
