"""``--scheduler`` against servers that are not (working) Dask schedulers (issue #49 defect 4).

Small socket servers in threads of the test process: one that accepts and never answers, one sending garbage, an
HTTP server, one announcing a huge frame; and addresses no connection can be made to (``ucx://`` without ucx-py,
``tls://`` without a TLS configuration, a 5,000-character host). Each is one line naming the address, exit 1,
within ``$PRECNB_SCHEDULER_TIMEOUT`` (plus start-up), and nothing is printed after the command ends (a half-made
``Client``'s ``__del__`` printed a traceback 30 s later). A bad ``$PRECNB_SCHEDULER_TIMEOUT`` is a usage error.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from tests._inprocess_cli import run_cli
from tests.conftest import SAMPLES

TIMEOUT = 2.0


def _server(reply: bytes | None, read_first: bool = False):
    """A listening socket on loopback whose connections get *reply* (None: nothing), then are held open."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            try:
                if read_first:
                    conn.settimeout(5)
                    conn.recv(65536)
                if reply:
                    conn.sendall(reply)
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    return srv, held


SERVERS = {
    "silent": (None, False),
    "garbage": (b"\x00garbage\xff\x13" * 64, False),
    "http": (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\nhello", True),
    "huge_frame": (struct.pack("<Q", 2**62) + struct.pack("<Q", 2**62), False),
}


def _nan(address: str, timeout: str = f"{TIMEOUT:g}s") -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PRECNB_SCHEDULER_TIMEOUT": timeout}
    env.pop("PRECNB_SCHEDULER", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "precnb", "nan", str(SAMPLES / "dp_nan"), "--scheduler", address],
                          capture_output=True, text=True, timeout=120, env=env)
    return proc, time.monotonic() - t0


def _one_line_naming(proc: subprocess.CompletedProcess, address: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("precnb nan: error: cannot reach the Dask scheduler at "), proc.stderr
    assert address[:100] in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert "out of memory" not in proc.stderr and proc.stdout == "", proc


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_a_server_that_is_not_a_scheduler_is_one_line_within_the_timeout(kind):
    srv, held = _server(*SERVERS[kind])
    address = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    try:
        proc, took = _nan(address)
    finally:
        srv.close()
        for c in held:
            c.close()
    _one_line_naming(proc, address)
    assert took < TIMEOUT + 60, took  # blocked for ever (silent) before (bound: start-up under a loaded CI)
    if kind == "silent":
        assert "no answer within 2 s" in proc.stderr, proc.stderr


@pytest.mark.parametrize("address", [
    "ucx://127.0.0.1:9", "tls://127.0.0.1:9", "tcp://" + "a" * 5000 + ":8786",
], ids=["ucx", "tls", "long_host"])
def test_an_address_no_connection_can_be_made_to_is_one_line(address):
    proc, took = _nan(address)
    _one_line_naming(proc, address)
    assert took < TIMEOUT + 60, took


@pytest.mark.parametrize("value", ["bogus", "-5", "0", "nan", "1e99"])
def test_a_bad_timeout_is_a_usage_error_naming_the_variable(value, monkeypatch):
    # refused before any connection is tried: `precnb nan` in this process (tests/_inprocess_cli.py)
    monkeypatch.setenv("PRECNB_SCHEDULER_TIMEOUT", value)
    monkeypatch.delenv("PRECNB_SCHEDULER", raising=False)
    proc = run_cli("nan", SAMPLES / "dp_nan", "--scheduler", "tcp://127.0.0.1:9")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("precnb nan: usage error: $PRECNB_SCHEDULER_TIMEOUT: "), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_the_timeout_accepts_durations(monkeypatch):
    from precnb.cli._scheduler import DEFAULT_TIMEOUT, scheduler_timeout

    for text, seconds in [("", DEFAULT_TIMEOUT), ("3s", 3.0), ("2.5", 2.5), ("1m", 60.0), ("2 minutes", 120.0),
                          ("500ms", 0.5)]:
        monkeypatch.setenv("PRECNB_SCHEDULER_TIMEOUT", text)
        assert scheduler_timeout() == seconds
