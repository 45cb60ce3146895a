"""A real vLLM engine (offline ``LLM`` API) hosted in a child process.

Why a child process: patched and stock engines must not share one Python
process (vLLM loads plugins once per process, and the A/B switch
``FUZZSERVE_PATCHES_OFF`` is read when the patches are applied), and a test
session must be able to kill what it started, by process group id, even if
an engine hangs.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import traceback
from typing import Any

_READY = "ready"


class EngineError(Exception):
    """An exception raised inside the engine host, re-raised in the test process."""

    def __init__(self, type_name: str, message: str, tb: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.tb = tb


def _serve(conn, env: dict[str, str], llm_kwargs: dict[str, Any], cpus: list[int] | None = None) -> None:
    os.setsid()  # own process group: the parent kills the engine and its children together
    os.environ.update(env)
    if cpus is not None:  # before the engine starts: EngineCore and the worker inherit it
        os.sched_setaffinity(0, cpus)
    try:
        from vllm import LLM, SamplingParams

        llm = LLM(**llm_kwargs)
        conn.send((_READY, os.getpid()))
    except BaseException as e:  # report start-up failures instead of hanging the parent
        conn.send(("error", (type(e).__name__, str(e), traceback.format_exc())))
        return
    while True:
        try:
            cmd, payload = conn.recv()
        except EOFError:
            break
        if cmd == "stop":
            break
        try:
            if cmd == "generate":
                prompts, params = payload
                sp = [SamplingParams(**p) for p in params] if isinstance(params, list) else SamplingParams(**params)
                outs = llm.generate(prompts, sp, use_tqdm=False)
                result = [
                    {
                        "text": o.outputs[0].text,
                        "token_ids": list(o.outputs[0].token_ids),
                        "finish_reason": o.outputs[0].finish_reason,
                    }
                    for o in outs
                ]
            elif cmd == "rpc":
                result = llm.collective_rpc(payload)
            elif cmd == "eval":
                fn, args = payload
                result = fn(llm, *args)
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", result))
        except BaseException as e:
            conn.send(("error", (type(e).__name__, str(e), traceback.format_exc())))
    del llm


class EngineHost:
    """Start with ``EngineHost(env, **llm_kwargs)``; call :meth:`close` when done."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        start_timeout: float = 600,
        cpus: list[int] | None = None,
        **llm_kwargs: Any,
    ):
        """``cpus``: the cores the host (``LLM``'s frontend) and, by inheritance, its engine processes may use
        (vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` in ``env`` still moves the worker's compute threads)."""
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, dict(env or {}), llm_kwargs, cpus), daemon=False)
        self.proc.start()
        child.close()
        if not self._conn.poll(start_timeout):
            self.close()
            raise TimeoutError(f"engine did not start within {start_timeout}s")
        status, payload = self._conn.recv()
        if status != _READY:
            self.close()
            raise EngineError(*payload)
        self.pid = payload

    def _request(self, cmd: str, payload: Any, timeout: float = 600) -> Any:
        self._conn.send((cmd, payload))
        if not self._conn.poll(timeout):
            raise TimeoutError(f"engine did not answer {cmd!r} within {timeout}s")
        status, result = self._conn.recv()
        if status == "error":
            raise EngineError(*result)
        return result

    def generate(self, prompts: list[str], params: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Generate; ``params`` are ``SamplingParams`` keyword arguments (one dict or one per prompt)."""
        return self._request("generate", (prompts, params))

    def rpc(self, fn) -> list[Any]:
        """``LLM.collective_rpc(fn)``: run ``fn(worker)`` in every worker process."""
        return self._request("rpc", fn)

    def eval(self, fn, *args) -> Any:
        """Run ``fn(llm, *args)`` in the host process (``fn`` must be importable)."""
        return self._request("eval", (fn, args))

    def alive(self) -> bool:
        return self.proc.is_alive()

    def close(self, timeout: float = 60) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("stop", None))
            self.proc.join(timeout)
        if (self.proc.is_alive() or self.proc.exitcode is not None) and self.proc.pid is not None:
            # Kill what is left of the engine's process group (EngineCore, workers).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.join(5)
        self._conn.close()


def engine_processes(_llm: Any = None) -> dict[int, str]:
    """The engine host's descendants, pid -> process title (``VLLM::EngineCore``, ``VLLM::Worker``, ...).

    For ``EngineHost.eval(engine_processes)``: it runs in the host process.
    """
    import psutil

    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[p.pid] = p.name()
        except psutil.NoSuchProcess:
            continue
    return out
