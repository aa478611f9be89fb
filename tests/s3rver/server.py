"""s3rver, the second S3 implementation the suites run against (besides moto's server).

s3rver (a Node.js S3 emulator on a directory of files, pinned in `tests/s3rver/package.json`) is
installed by `make setup` with `npm ci` into `tests/s3rver/node_modules`. `S3rverServer` starts it as
a child process on 127.0.0.1 with a port the OS picks and its own data directory, reads the port from
its first line of output, and stops it by its pid.

Node >= 17 ships OpenSSL 3, which disables the DES cipher s3rver encrypts its ListObjectsV2
continuation tokens with: without `--openssl-legacy-provider` every truncated listing answers
500 InternalError. The server runs with that flag there (see docs/s3.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

S3RVER_DIR = Path(__file__).resolve().parent
S3RVER_SCRIPT = S3RVER_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
S3RVER_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
"""The only key pair s3rver accepts (its default account)."""

_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


def _legacy_openssl_flag(node: str) -> list[str]:
    """`--openssl-legacy-provider` on Node >= 17 (OpenSSL 3), where it exists and is needed."""
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    major = int(version.strip().lstrip("v").split(".")[0])
    return ["--openssl-legacy-provider"] if major >= 17 else []


class S3rverNotInstalledError(RuntimeError):
    """node or the npm package is missing: `make setup` installs it."""


class S3rverServer:
    """One s3rver process on 127.0.0.1 with a free port and its own data directory."""

    def __init__(self, data_dir: Path, *, start_timeout_s: float = 30.0) -> None:
        self.data_dir = data_dir
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._port: int | None = None

    def start(self) -> S3rverServer:
        node = shutil.which("node")
        if node is None:
            raise S3rverNotInstalledError("node not found: install Node.js (e.g. 'apt-get install nodejs npm')")
        if not S3RVER_SCRIPT.is_file():
            raise S3rverNotInstalledError(f"{S3RVER_SCRIPT} is missing: run 'make setup' (npm ci in {S3RVER_DIR})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NODE_"))}
        self._proc = subprocess.Popen(
            [
                node,
                *_legacy_openssl_flag(node),
                str(S3RVER_SCRIPT),
                "--directory",
                str(self.data_dir),
                "--address",
                "127.0.0.1",
                "--port",
                "0",
                "--silent",
                "--no-vhost-buckets",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._port = self._read_port(self._proc)
        return self

    def _read_port(self, proc: subprocess.Popen[str]) -> int:
        """The port from s3rver's "listening on" line; the rest of its output is drained and dropped."""
        assert proc.stdout is not None
        out = proc.stdout
        found: list[int] = []
        seen: list[str] = []
        ready = threading.Event()

        def drain() -> None:
            for line in out:
                if not found:
                    seen.append(line)
                    m = _LISTENING.search(line)
                    if m:
                        found.append(int(m.group(1)))
                        ready.set()
            ready.set()

        threading.Thread(target=drain, name="s3rver-output", daemon=True).start()
        ready.wait(self.start_timeout_s)
        if not found:
            self.stop()
            raise RuntimeError(f"s3rver did not start within {self.start_timeout_s}s: {''.join(seen)[-2000:]}")
        return found[0]

    @property
    def endpoint_url(self) -> str:
        assert self._port is not None, "s3rver is not started"
        return f"http://127.0.0.1:{self._port}"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
