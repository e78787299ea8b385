"""SyncJobClient: the same client for code without an event loop.

What it owns
------------
A blocking facade over one ``JobClient``: every method has ``JobClient``'s arguments
and behaviour (failover, retries, paging) and blocks until the call is done; the
iterators (``iter_pages``, ``iter_documents``, ``watch``) are plain ones.

Why it is safe
--------------
The ``JobClient`` lives on a private event loop in a daemon thread
(``pagesift-client``) and is made there, as its channels must be; every call is
submitted to that one loop, so the client works in threads, in scripts and next to
another event loop alike, and threads may share it. A caller interrupted while it
waits (Ctrl-C) cancels the call on the loop too. ``close()`` (or ``with``) closes the
channels, then stops and joins the thread; a closed client refuses calls.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from pagesift.client.aio import JobClient

__all__ = ["SyncJobClient"]

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[JobClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncJobClient, P], T]:
    """``JobClient.method`` as a blocking ``SyncJobClient`` method (same arguments)."""

    def run(self: SyncJobClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.run(lambda client: method(client, *args, **kwargs))

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


def _blocking_iter(
    method: Callable[Concatenate[JobClient, P], AsyncIterator[T]],
) -> Callable[Concatenate[SyncJobClient, P], Iterator[T]]:
    """``JobClient.method`` (an async iterator) as a ``SyncJobClient`` generator."""

    def run(self: SyncJobClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(lambda client: method(client, *args, **kwargs))

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


class SyncJobClient:
    """``JobClient`` for code without an event loop (the module docstring says how).

    The keyword arguments are ``JobClient``'s. Use ``with SyncJobClient([...]) as c`` or
    ``close()``. ``run(lambda c: c.some_call(...))`` runs any ``JobClient`` coroutine.
    """

    def __init__(self, addresses: str | Sequence[str] | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pagesift-client", daemon=True
        )
        self._thread.start()
        try:
            self._client: JobClient = self._submit(self._make(addresses, dict(options)))
        except BaseException:
            self._stop()
            raise

    @staticmethod
    async def _make(addresses: str | Sequence[str] | None, options: Mapping[str, Any]) -> JobClient:
        return JobClient(addresses, **options)  # made on its loop, as its channels will be

    def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("SyncJobClient is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. Ctrl-C while waiting: the call is cancelled too
            raise

    def _stop(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def client(self) -> JobClient:
        """The wrapped ``JobClient`` (use it only through ``run``: it lives on another loop)."""
        return self._client

    @property
    def addresses(self) -> list[str]:
        return self._client.addresses

    def run(self, call: Callable[[JobClient], Awaitable[T]]) -> T:
        """Run ``call(client)`` on the client's loop and return its result."""

        async def invoke() -> T:
            return await call(self._client)

        return self._submit(invoke())

    def _iterate(self, make: Callable[[JobClient], AsyncIterator[T]]) -> Iterator[T]:
        iterator = make(self._client)

        async def step() -> tuple[bool, T | None]:
            try:
                return True, await anext(iterator)
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, item = self._submit(step())
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None and not self._loop.is_closed():
                self._submit(close())

    def close(self) -> None:
        """Close the channels and stop the loop's thread (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            self._submit(self._client.close())
        finally:
            self._stop()

    def __enter__(self) -> SyncJobClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    scrape = _blocking(JobClient.scrape)
    start_batch = _blocking(JobClient.start_batch)
    start_crawl = _blocking(JobClient.start_crawl)
    append_batch = _blocking(JobClient.append_batch)
    get_job = _blocking(JobClient.get_job)
    errors_page = _blocking(JobClient.errors_page)
    errors = _blocking(JobClient.errors)
    cancel = _blocking(JobClient.cancel)
    resume = _blocking(JobClient.resume)
    map = _blocking(JobClient.map)
    list_jobs_page = _blocking(JobClient.list_jobs_page)
    list_jobs = _blocking(JobClient.list_jobs)
    account_usage = _blocking(JobClient.account_usage)
    role = _blocking(JobClient.role)
    promote = _blocking(JobClient.promote)
    find_primary = _blocking(JobClient.find_primary)
    wait_connected = _blocking(JobClient.wait_connected)
    iter_pages = _blocking_iter(JobClient.iter_pages)
    iter_documents = _blocking_iter(JobClient.iter_documents)
    watch = _blocking_iter(JobClient.watch)
