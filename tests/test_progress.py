"""Progress bars only where someone watches: a terminal (or a notebook), never into a pipe or a log."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading

from tests.conftest import sample_path


def test_no_bar_when_stderr_is_a_pipe():
    mon = sample_path("monitor")  # 76 CSV files: above the bar's threshold
    proc = subprocess.run([sys.executable, "-m", "precnb", "anomalies", str(mon), "--workers", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and "\r" not in proc.stdout
    assert proc.stdout.startswith("FIRST ANOMALY: actv_grad/lm_head.input norm spikes")


def test_a_bar_on_a_terminal():
    mon = sample_path("monitor")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    try:
        chunks: list[bytes] = []

        def drain():
            while True:
                try:
                    data = os.read(leader, 65536)
                except OSError:
                    return
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        proc = subprocess.run([sys.executable, "-m", "precnb", "info", str(mon), "--workers", "1"],
                              stdout=subprocess.PIPE, stderr=follower, timeout=300)
        os.close(follower)
        follower = -1
        reader.join(10)
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == 0
    assert b"reading dumps" in b"".join(chunks)
    assert b"\r" not in proc.stdout  # the answer itself stays clean
