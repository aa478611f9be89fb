"""Running the `statekeeper` command line in a child process, as its users do.

The child gets its own ``STATEKEEPER_HOME`` (so its embedded catalog is the test's) and never the
developer's ``STATEKEEPER_DB_URL``.

Each command runs in a fresh process, forked from a zygote: a single-threaded process that imported the
command line's modules once. A fork costs milliseconds where a new interpreter importing SQLAlchemy, boto3
and the catalog costs about two seconds, and the CLI suites run hundreds of commands. The child is what
``python -m statekeeper.maintenance ARGS`` would be after its imports: its own environment, working
directory, stdin from /dev/null, stdout and stderr to files, an interpreter exit (non-daemon threads joined,
atexit handlers run, output flushed; the modules are not torn down) and its exit code or signal. No product
module reads the environment at import time, so nothing the zygote imported with its own environment leaks
into a command.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ZYGOTE = r"""
import atexit, gc, importlib, json, os, pkgutil, runpy, sys, threading
import statekeeper.maintenance as _m
for _info in pkgutil.iter_modules(_m.__path__, "statekeeper.maintenance."):
    if not _info.name.endswith("__main__"):
        importlib.import_module(_info.name)
import statekeeper.sql, statekeeper.store.files.s3  # the catalog and S3 stacks every command may open

def _child(request):
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    sys.argv = ["statekeeper", *request["args"]]
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else (print(e.code, file=sys.stderr), 1)[1]
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    # The interpreter's exit, less tearing down the modules (which would touch, and so copy, every page the
    # zygote shares with this child): non-daemon threads joined, atexit handlers run, output flushed.
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

gc.freeze()  # the zygote's objects are never collected: a child's collections leave its pages shared
_requests = os.fdopen(0, "r")
_answers = os.fdopen(os.dup(1), "w", buffering=1)
for _line in _requests:
    _request = json.loads(_line)
    sys.stdout.flush()
    sys.stderr.flush()
    _pid = os.fork()
    if _pid == 0:
        _answers.close()
        _requests.close()
        _child(_request)
    _answers.write(json.dumps({"pid": _pid}) + "\n")
    _, _status = os.waitpid(_pid, 0)
    _answers.write(json.dumps({"code": os.waitstatus_to_exitcode(_status)}) + "\n")
"""


class _Zygote:
    """The zygote of this test process: started on first use, one command at a time, stopped at exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None

    def _started(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _ZYGOTE], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
            )
            atexit.register(self.proc.kill)
        return self.proc

    @staticmethod
    def _answer(fd: int, timeout: float | None = None) -> dict[str, int] | None:
        """The zygote's next answer line, or None when none came within `timeout` (unbuffered: select sees all)."""
        line = b""
        while not line.endswith(b"\n"):
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 1)
            if not chunk:
                raise RuntimeError("the command-line zygote ended")
            line += chunk
        answer: dict[str, int] = json.loads(line)
        return answer

    def run(
        self, args: tuple[str, ...], env: dict[str, str], timeout: float, module: str = "statekeeper.maintenance"
    ) -> subprocess.CompletedProcess[str]:
        """``python -m MODULE ARGS`` forked from the zygote (a module of this repository: the zygote imported the
        command line's modules, and the child imports whatever else `module` needs)."""
        with self.lock, tempfile.TemporaryDirectory(prefix="statekeeper-cli-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            request = {"module": module, "args": list(args), "env": env, "cwd": str(ROOT), "stdout": out, "stderr": err}
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            fd = proc.stdout.fileno()
            started = self._answer(fd)
            assert started is not None
            ended = self._answer(fd, timeout)
            if ended is None:
                os.kill(started["pid"], signal.SIGKILL)
                self._answer(fd)
            cmd = ["statekeeper", *args]
            stdout, stderr = Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace")
            if ended is None:
                raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
            return subprocess.CompletedProcess(cmd, ended["code"], stdout, stderr)


_zygote = _Zygote()


def run_module(module: str, *args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` in a fresh process forked from the zygote, with exactly `env` (no check of
    its exit: a test that kills its child expects -SIGKILL)."""
    return _zygote.run(args, env, timeout, module=module)


def run_cli(
    *args: str,
    home: Path,
    check: int | None = 0,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m statekeeper.maintenance ARGS`` in a fresh process; with `check`, the exit code it must end with."""
    full_env = {**os.environ, "STATEKEEPER_HOME": str(home), **(env or {})}
    full_env.pop("STATEKEEPER_DB_URL", None)
    proc = _zygote.run(args, full_env, timeout)
    if check is not None:
        assert proc.returncode == check, (
            f"statekeeper {' '.join(args)}: exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
            f"stderr:\n{proc.stderr[-4000:]}"
        )
    return proc
