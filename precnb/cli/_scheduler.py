"""Connecting to ``--scheduler`` / ``$PRECNB_SCHEDULER`` within ``$PRECNB_SCHEDULER_TIMEOUT`` (issue #49 defect 4).

``distributed.Client(address, timeout=...)`` does not bound everything: its comm handshake reads the peer's answer
without a deadline (a server that accepts and never answers blocked for ever), a server sending garbage or an
oversized frame surfaced as ``MemoryError`` or an internal error, an unsupported scheme (``ucx://`` without
ucx-py) as a ``TypeError``, and the half-made client's ``__del__`` printed a traceback 30 s after the command.

Here the address is first *probed* in a thread of its own — the Dask handshake and one ``identity`` request, the
whole under one deadline — and only a server that answered like a Dask scheduler gets a client, whose start is
bounded by the same deadline and which is closed quietly. Every failure is one :class:`~precnb.errors.PrecnbError`
line naming the address.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from typing import Any

from precnb.errors import PrecnbError

__all__ = ["DEFAULT_TIMEOUT", "connect_client", "scheduler_timeout"]

DEFAULT_TIMEOUT = 15.0
_MAX_TIMEOUT = 24 * 3600.0
_ENV = "PRECNB_SCHEDULER_TIMEOUT"


def scheduler_timeout() -> float:
    """``$PRECNB_SCHEDULER_TIMEOUT`` in seconds (``15s``, ``2.5``, ``1m``; default 15 s).

    Raises
    ------
    ValueError
        When it is not a positive duration of at most a day (the caller makes it a usage error).
    """
    text = os.environ.get(_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    from dask.utils import parse_timedelta

    try:
        value = float(parse_timedelta(text, default="seconds") or 0.0)
    except (ValueError, TypeError, KeyError, OverflowError):
        raise ValueError(f"${_ENV}: {text[:80]!r} is not a duration (e.g. 15s, 2.5, 1m)") from None
    if not math.isfinite(value) or value <= 0 or value > _MAX_TIMEOUT:
        raise ValueError(f"${_ENV}: {text[:80]!r} must be a positive duration of at most a day (e.g. 15s)")
    return value


def _shown(address: str) -> str:
    return address if len(address) <= 120 else f"{address[:100]}... ({len(address)} characters)"


def _why(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "it sent an oversized frame (not a Dask scheduler?)"
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    name = type(exc).__name__
    name = f"{type(exc).__module__}.{name}" if name == "error" else name  # struct.error: a malformed frame
    return f"{name}: {text}" if text else name


async def _probe(address: str, timeout: float) -> None:
    from distributed.comm import connect
    from distributed.security import Security

    comm = await connect(address, timeout=timeout, **Security().get_connection_args("client"))
    try:
        await comm.write({"op": "identity", "reply": True})
        reply = await comm.read()
    finally:
        with contextlib.suppress(Exception):
            comm.abort()
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        kind = reply.get("type") if isinstance(reply, dict) else type(reply).__name__
        raise ConnectionError(f"the server answered, but is not a Dask scheduler ({str(kind)[:60]})")


def _probe_bounded(address: str, timeout: float) -> BaseException | None:
    """Run :func:`_probe` in a daemon thread with its own event loop; the failure, or None."""
    import asyncio

    outcome: list[BaseException | None] = []

    def run() -> None:
        async def bounded() -> None:
            await asyncio.wait_for(_probe(address, timeout), timeout)

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(bounded())
            outcome.append(None)
        except BaseException as exc:  # every failure of the probe is reported, none escapes its thread
            outcome.append(exc)
        finally:
            with contextlib.suppress(Exception):
                loop.close()

    thread = threading.Thread(target=run, name="precnb-scheduler-probe", daemon=True)
    thread.start()
    thread.join(timeout + 2.0)
    if not outcome:
        return TimeoutError()
    return outcome[0]


def _quiet_client_class() -> type:
    from distributed import Client

    class _Client(Client):  # type: ignore[misc]
        """A Client whose start is bounded and whose finalizer never prints (a half-made one is closed quietly)."""

        _precnb_deadline: float | None = None

        def start(self, **kwargs: Any) -> Any:
            if self._precnb_deadline is not None and not self.asynchronous:
                kwargs.setdefault("callback_timeout", self._precnb_deadline)
            return super().start(**kwargs)

        def close(self, timeout: Any = None) -> Any:
            with contextlib.suppress(Exception):
                return super().close(timeout=timeout if timeout is not None else 2.0)
            return None

        def __del__(self) -> None:
            with contextlib.suppress(Exception):
                if getattr(self, "status", "closed") not in ("closed", "newly-created"):
                    self.close(timeout=1.0)

    return _Client


def connect_client(address: str, origin: str, timeout: float) -> Any:
    """A ``distributed.Client`` of the scheduler at *address*, connected within *timeout* seconds.

    Raises
    ------
    precnb.errors.PrecnbError
        One line naming the address and *origin* (``--scheduler`` or ``$PRECNB_SCHEDULER``) and why.
    """
    where = f"the Dask scheduler at {_shown(address)} ({origin})"
    try:
        client_class = _quiet_client_class()
    except ImportError as exc:  # pragma: no cover - cli_client checks the dask extra first
        raise PrecnbError(f"{origin} {_shown(address)}: dask.distributed is not installed ({exc}): "
                          "pip install 'precnb[dask]'") from None
    failure = _probe_bounded(address, timeout)
    if isinstance(failure, TimeoutError) and not str(failure):
        failure = TimeoutError(f"no answer within {timeout:g} s ($PRECNB_SCHEDULER_TIMEOUT)")
    if failure is not None:
        raise PrecnbError(f"cannot reach {where}: {_why(failure)}") from None
    client_class._precnb_deadline = timeout
    try:
        return client_class(address, timeout=timeout, set_as_default=False)
    except Exception as exc:  # MemoryError (an oversized frame) included: one line, never an internal error
        raise PrecnbError(f"cannot reach {where}: {_why(exc)}") from None
