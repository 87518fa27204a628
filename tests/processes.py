"""``python -m layerscope ARGS`` (or another ``python`` command: a module, ``-c`` code, a
script) as a process of its own, started from a warm interpreter.

A command's process spends most of its life importing torch (2 to 4 s on a small
machine, torch's dynamo included: its fake tensors, which count shapes, import it), and
the suite runs a few hundred of them. So one interpreter per test session imports torch,
``torch._dynamo`` and ``layerscope.cli`` once and *forks* a child per command. The child
is a process of its own, as a user's command is: it takes the command's working folder,
environment, ``sys.argv``, ``sys.path`` (the folder first, as ``-m`` puts it, then
``PYTHONPATH``), stdin from ``/dev/null`` and its own stdout and stderr files, then runs
``layerscope`` as ``__main__``; what it raises or exits with is handled by Python's own
top level (a traceback and exit 1, ``SystemExit``'s code, death by SIGINT on an unhandled
Ctrl-C), and its exit status is read as ``subprocess`` reads one.

``LAYERSCOPE_TEST_COLD=1`` runs every command as a plain ``python`` subprocess instead; ``test_cli.py`` runs a few commands both ways and compares them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: The warm interpreter: imports, then one JSON request per line on stdin, one reply
#: ({"pid"}, then {"status"}) per line on stdout. The child leaves ``serve`` and becomes
#: the command; everything after it runs in the child only.
_WARM = r"""
import gc, json, os, sys
import torch, torch._dynamo  # what a command spends its start on
import layerscope.cli
gc.freeze()  # the imports' objects: left out of every collection, here and in each child

def serve():
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return request
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": status}), flush=True)
    raise SystemExit(0)

request = serve()
null = os.open(os.devnull, os.O_RDONLY)
out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for fd, target in ((null, 0), (out, 1), (err, 2)):
    os.dup2(fd, target)
    os.close(fd)
sys.stdin = open(0, closefd=False)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
sys.path[1:1] = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
import runpy
words = request["python"]  # after the interpreter's name: -m MODULE ARGS, -c CODE ARGS or SCRIPT ARGS
if words[0] == "-m":
    sys.path[0] = request["cwd"]
    sys.argv = ["-m", *words[2:]]
    runpy.run_module(words[1], run_name="__main__", alter_sys=True)
elif words[0] == "-c":
    sys.path[0] = ""
    sys.argv = ["-c", *words[2:]]
    exec(compile(words[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
else:
    sys.path[0] = os.path.dirname(os.path.abspath(words[0]))
    sys.argv = words
    runpy.run_path(words[0], run_name="__main__")
"""


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def cold() -> bool:
    return os.environ.get("LAYERSCOPE_TEST_COLD", "") not in ("", "0")


class _Warm:
    """The session's warm interpreter, started on first use, stopped at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._folder = tempfile.TemporaryDirectory(prefix="layerscope-warm-")
        self._pending = b""  # read from the interpreter, not yet a whole reply
        atexit.register(self.stop)

    def _start(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            log = open(Path(self._folder.name) / "warm.log", "w")  # the interpreter's own stderr
            self._process = subprocess.Popen(
                [sys.executable, "-c", _WARM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True, bufsize=1,
            )
            log.close()
            self._pending = b""
        return self._process

    def _reply(self, process: subprocess.Popen[str], timeout: float) -> dict[str, int]:
        """The next reply line, read from the pipe's descriptor itself (a buffered
        reader could take both replies at once and leave ``select`` waiting)."""
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([process.stdout], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(process.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                raise TimeoutError
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        reply: dict[str, int] = json.loads(line)
        return reply

    def run(self, python: list[str], cwd: Path, env: dict[str, str], stdout: Path | None, timeout: float) -> Done:
        """``python``: the command's words after the interpreter's name."""
        with self._lock:
            process = self._start()
            assert process.stdin is not None
            with tempfile.TemporaryDirectory(dir=self._folder.name) as folder:
                out, err = stdout or Path(folder) / "stdout", Path(folder) / "stderr"
                request = {"python": python, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
                try:
                    pid = self._reply(process, 60)["pid"]
                except TimeoutError:
                    log = Path(self._folder.name) / "warm.log"
                    raise RuntimeError(f"the warm interpreter did not start the command: {log.read_text()[-2000:]}") from None
                try:
                    status = self._reply(process, timeout)["status"]
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    self._reply(process, 60)
                    raise subprocess.TimeoutExpired(["python", *python], timeout) from None
                return Done(
                    os.waitstatus_to_exitcode(status),
                    "" if stdout is not None else out.read_text(encoding="utf-8"),
                    err.read_text(encoding="utf-8"),
                )

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._process = None


_warm = _Warm()


def run_layerscope(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, stdout: Path | None = None,
    timeout: float = 300, warm: bool | None = None,
) -> Done:
    """``python -m layerscope ARGS`` in ``cwd`` with ``env`` (this process's by default),
    its stdout captured, or written to the file ``stdout`` (then ``Done.stdout`` is
    empty). ``warm`` (default: unless ``LAYERSCOPE_TEST_COLD`` is set) forks it from
    the warm interpreter; otherwise it is a plain subprocess."""
    return run_python(["-m", "layerscope", *args], cwd, env, stdout, timeout, warm)


def run_python(
    python: list[str], cwd: Path, env: dict[str, str] | None = None, stdout: Path | None = None,
    timeout: float = 300, warm: bool | None = None,
) -> Done:
    """``python PYTHON...`` (``-m MODULE ARGS``, ``-c CODE ARGS`` or ``SCRIPT ARGS``), as
    ``run_layerscope`` runs ``-m layerscope``: a script's path is relative to ``cwd``."""
    env = dict(os.environ if env is None else env)
    if warm is None:
        warm = not cold()
    if warm:
        return _warm.run(list(python), Path(cwd).resolve(), env, None if stdout is None else Path(stdout).resolve(), timeout)
    with contextlib.ExitStack() as stack:
        sink = subprocess.PIPE if stdout is None else stack.enter_context(open(stdout, "wb"))
        result = subprocess.run(
            [sys.executable, *python], cwd=cwd, env=env, stdout=sink, stderr=subprocess.PIPE,
            text=True, timeout=timeout, check=False,
        )
    return Done(result.returncode, result.stdout or "", result.stderr)
