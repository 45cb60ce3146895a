"""Start a server as a child process group, wait until it answers, kill it by id."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx


class ServerProcess:
    def __init__(
        self,
        argv: list[str],
        health_url: str,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        start_timeout: float = 600,
    ):
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else None  # noqa: SIM115 -- held for the object's life, closed when it stops
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **(env or {})},
            stdout=self._log if self._log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_healthy(health_url, start_timeout)
        except BaseException:  # a timeout, or Ctrl-C while waiting: never leave the server behind
            self.close()
            raise

    def _wait_healthy(self, health_url: str, start_timeout: float) -> None:
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before answering; log: {self.log_path}")
            try:
                if httpx.get(health_url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server did not answer {health_url} in {start_timeout}s; log: {self.log_path}")
            time.sleep(1)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 30) -> None:
        """SIGTERM the process group, then SIGKILL what is left."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                # the leader is gone; make sure its children are too
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        if self._log is not None:
            self._log.close()
