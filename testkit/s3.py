"""Local S3 for tests and benchmarks: moto's S3 served by waitress (in a thread, or a child process with its
own GIL), the environment that points statekeeper at it with fake credentials, bucket helpers, and a
fault-injecting HTTP proxy in front of it.

The proxy speaks plain HTTP/1.1 to the client (botocore) and forwards each request to moto. It
injects the failures S3 really produces (503 SlowDown, 500, connection resets before and after the
request took effect, hung responses, truncated bodies, per-key DeleteObjects errors) on a seeded
random fraction of requests or by rule, so the retry and idempotency paths run over real sockets.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import logging
import os
import random
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import parse_qs, urlsplit

from botocore.config import Config
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer

from statekeeper.store.files.s3.client import new_session

log = logging.getLogger(__name__)

REPOSITORY = Path(__file__).resolve().parent.parent

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
ET.register_namespace("", S3_NS)  # rewritten XML keeps S3's default namespace (no ns0: prefixes)
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-access-key",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key-do-not-leak",
    "AWS_SESSION_TOKEN": "testing-session-token",
}


def point_statekeeper_at(mp: Any, endpoint_url: str) -> None:
    """Set (through pytest's MonkeyPatch `mp`) the environment that sends statekeeper's S3 client to the test
    server at `endpoint_url`, with fake credentials and no profile, config file or instance metadata, so no
    real AWS account is ever reached."""
    for k, v in TEST_CREDENTIALS.items():
        mp.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        mp.delenv(k, raising=False)
    mp.setenv("AWS_CONFIG_FILE", "/dev/null")
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mp.setenv("STATEKEEPER_S3_ENDPOINT_URL", endpoint_url)


@contextmanager
def emulator_env(endpoint_url: str | None = None) -> Iterator[None]:
    """`TEST_CREDENTIALS` in this process's environment (and so its children's) for the duration, so that no real
    AWS profile is read; with `endpoint_url`, statekeeper's S3 client sent there (us-east-1) too. The previous
    values are restored after. `point_statekeeper_at` does the same, more strictly, through pytest."""
    values = dict(TEST_CREDENTIALS)
    if endpoint_url is not None:
        values.update(STATEKEEPER_S3_ENDPOINT_URL=endpoint_url, AWS_DEFAULT_REGION="us-east-1")
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# fault kinds
SLOWDOWN = "503"  # 503 SlowDown, request not forwarded
INTERNAL = "500"  # 500 InternalError, request not forwarded
INTERNAL_AFTER = "500-after"  # request took effect, then 500
RESET = "reset"  # connection reset before forwarding
RESET_AFTER = "reset-after"  # request took effect, response lost (reset)
TIMEOUT = "timeout"  # no answer until the client's read timeout
TRUNCATE = "truncate"  # GET body cut in the middle, then reset
DENY = "deny"  # 403 AccessDenied
ALL_FAULTS = (SLOWDOWN, INTERNAL, INTERNAL_AFTER, RESET, RESET_AFTER, TIMEOUT, TRUNCATE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_client(endpoint_url: str, **config: Any) -> Any:
    """A plain boto3 client for setup and inspection (no statekeeper code in the way); `config` adds to or
    replaces botocore `Config` settings."""
    cfg = Config(**{"s3": {"addressing_style": "path"}, "retries": {"mode": "standard", "max_attempts": 3}, **config})
    return new_session().client("s3", endpoint_url=endpoint_url, region_name="us-east-1", config=cfg)


def new_bucket_name() -> str:
    return f"sk-test-{uuid.uuid4().hex[:16]}"


def empty_and_delete_bucket(client: Any, bucket: str) -> None:
    """Best-effort cleanup so the server's memory or disk does not grow over a session."""
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            for up in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    except Exception as e:  # s3rver does not implement ListMultipartUploads
        log.debug("incomplete uploads of bucket %s not aborted: %s", bucket, e)
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
    except Exception as e:  # cleanup must not fail a test
        log.debug("cleanup of bucket %s failed: %s", bucket, e)


def all_keys(client: Any, bucket: str, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["Size"]
    return out


def incomplete_uploads(client: Any, bucket: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        out.extend(page.get("Uploads", []))
    return out


@dataclass
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query, keep_blank_values=True)

    def header(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    @property
    def key(self) -> str:
        """The object key (path style: /bucket/key), '' for bucket-level requests."""
        parts = self.path.lstrip("/").split("/", 1)
        return parts[1] if len(parts) > 1 else ""

    @property
    def operation(self) -> str:
        q, m = self.query, self.method
        if m == "POST" and "delete" in q:
            return "DeleteObjects"
        if m == "POST" and "uploads" in q:
            return "CreateMultipartUpload"
        if m == "POST" and "uploadId" in q:
            return "CompleteMultipartUpload"
        if m == "PUT" and "partNumber" in q:
            return "UploadPart"
        if m == "DELETE" and "uploadId" in q:
            return "AbortMultipartUpload"
        if m == "GET" and "uploads" in q:
            return "ListMultipartUploads"
        if m == "GET" and "list-type" in q:
            return "ListObjectsV2"
        if m == "GET" and "uploadId" in q:
            return "ListParts"
        object_ops = {"PUT": "PutObject", "GET": "GetObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}
        bucket_ops = {"PUT": "CreateBucket", "GET": "ListObjects", "HEAD": "HeadBucket", "DELETE": "DeleteBucket"}
        return (object_ops if self.key else bucket_ops).get(m, m)


Rule = Callable[[Request], str | None]
"""Returns a fault kind to inject for this request, or None."""
KeyFault = Callable[[str], str | None]
"""For DeleteObjects: the error code to report for a key instead of deleting it, or None."""


def _error_xml(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
        f"<RequestId>fault-{uuid.uuid4().hex[:8]}</RequestId></Error>"
    ).encode()


_ERRORS = {
    SLOWDOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    INTERNAL: (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    INTERNAL_AFTER: (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
    DENY: (403, "Forbidden", "AccessDenied", "Access Denied"),
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "host", "proxy-connection"}


@dataclass
class FaultProxy:
    """HTTP proxy on 127.0.0.1 that forwards to `upstream` and injects faults.

    `rate` of requests (seeded) get a random kind from `kinds` when applicable; `rules` decide
    targeted faults first. `key_fault` makes DeleteObjects report per-key errors for keys it
    withholds from the store. `ignore_if_none_match` strips the header, like a store without
    conditional writes.
    """

    upstream: str
    rate: float = 0.0
    kinds: tuple[str, ...] = ALL_FAULTS
    seed: int = 0
    hang_s: float = 1.5
    rules: list[Rule] = field(default_factory=list)
    key_fault: KeyFault | None = None
    ignore_if_none_match: bool = False
    injected: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)
    log: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        up = urlsplit(self.upstream)
        self._up_host, self._up_port = up.hostname or "127.0.0.1", up.port or 80
        self._server: socketserver.ThreadingTCPServer | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request, cast(IO[bytes], self.rfile), cast(IO[bytes], self.wfile))

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_faults(self, rate: float, kinds: Iterable[str] = ALL_FAULTS) -> None:
        with self._lock:
            self.rate, self.kinds = rate, tuple(kinds)

    # -- per connection -------------------------------------------------------------------------
    def _serve(self, sock: socket.socket, rfile: IO[bytes], wfile: IO[bytes]) -> None:
        try:
            while True:
                req = self._read_request(rfile, wfile)
                if req is None:
                    return
                if not self._handle(sock, req, wfile):
                    return
        except (ConnectionError, OSError, ValueError):
            return

    def _read_request(self, rfile: IO[bytes], wfile: IO[bytes]) -> Request | None:
        line = rfile.readline(65537)
        if not line or not line.strip():
            return None
        method, target, _version = line.decode("latin-1").split()
        headers: list[tuple[str, str]] = []
        while True:
            h = rfile.readline(65537)
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        req = Request(method, target, headers, b"")
        if (req.header("Expect") or "").lower() == "100-continue":
            wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            wfile.flush()
        if (req.header("Transfer-Encoding") or "").lower() == "chunked":
            chunks = []
            while True:
                size = int(rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(rfile.read(size))
                rfile.readline()
            req.body = b"".join(chunks)
        else:
            req.body = rfile.read(int(req.header("Content-Length") or 0))
        return req

    def _choose(self, req: Request) -> str | None:
        for rule in self.rules:
            kind = rule(req)
            if kind is not None:
                return kind
        with self._lock:
            if self.rate <= 0 or self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(self.kinds)
        if kind == TRUNCATE and req.operation != "GetObject":
            kind = SLOWDOWN
        return kind

    def _handle(self, sock: socket.socket, req: Request, wfile: IO[bytes]) -> bool:
        """Answer one request; False when the connection is gone."""
        op = req.operation
        kind = self._choose(req)
        with self._lock:
            self.requests[op] += 1
            if kind is not None:
                self.injected[kind] += 1
                self.log.append((op, req.key, kind))
        if kind in (SLOWDOWN, INTERNAL, DENY):
            status, reason, code, message = _ERRORS[kind]
            self._respond(wfile, req, status, reason, [("Content-Type", "application/xml")], _error_xml(code, message))
            return True
        if kind == RESET:
            self._reset(sock)
            return False
        if kind == TIMEOUT:
            time.sleep(self.hang_s)
            self._reset(sock)
            return False
        if op == "DeleteObjects" and self.key_fault is not None:
            status, reason, headers, body = self._delete_with_key_faults(req)
        else:
            status, reason, headers, body = self._forward(req)
        if kind == RESET_AFTER:
            self._reset(sock)
            return False
        if kind == INTERNAL_AFTER:
            status, reason, code, message = _ERRORS[kind]
            self._respond(wfile, req, status, reason, [("Content-Type", "application/xml")], _error_xml(code, message))
            return True
        if kind == TRUNCATE and len(body) > 1:
            self._respond(wfile, req, status, reason, headers, body[: len(body) // 2], content_length=len(body))
            self._reset(sock)
            return False
        self._respond(wfile, req, status, reason, headers, body)
        return True

    def _forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self._up_host, self._up_port, timeout=60)
        try:
            conn.putrequest(req.method, req.target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", f"{self._up_host}:{self._up_port}")
            for k, v in req.headers:
                if k.lower() in _HOP:
                    continue
                if self.ignore_if_none_match and k.lower() == "if-none-match":
                    continue
                conn.putheader(k, v)
            if req.body or req.method in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(req.body)))
            conn.endheaders(req.body or None)
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, resp.reason, resp.getheaders(), body
        finally:
            conn.close()

    def _delete_with_key_faults(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Withhold the keys `key_fault` picks and report them as errors next to the store's answer."""
        assert self.key_fault is not None
        root = ET.fromstring(req.body)
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        faults: list[tuple[str, str]] = []
        for obj in list(root.findall(f"{ns}Object")):
            key = obj.findtext(f"{ns}Key") or ""
            code = self.key_fault(key)
            if code is not None:
                faults.append((key, code))
                root.remove(obj)
        with self._lock:
            self.injected["delete-key-" + "-".join(sorted({c for _, c in faults}))] += bool(faults)
        if root.findall(f"{ns}Object"):
            body = ET.tostring(root, encoding="utf-8", xml_declaration=True)
            headers = [
                (k, v)
                for k, v in req.headers
                if not k.lower().startswith("x-amz-checksum")
                and k.lower() not in ("content-md5", "x-amz-sdk-checksum-algorithm")
            ]
            headers.append(("Content-MD5", base64.b64encode(hashlib.md5(body).digest()).decode()))
            status, reason, resp_headers, data = self._forward(Request(req.method, req.target, headers, body))
            if status != 200:
                return status, reason, resp_headers, data
            result = ET.fromstring(data)
        else:
            resp_headers = [("Content-Type", "application/xml")]
            status, reason = 200, "OK"
            result = ET.Element(f"{{{S3_NS}}}DeleteResult")
        rns = result.tag[: result.tag.index("}") + 1] if result.tag.startswith("{") else ""
        for key, code in faults:
            err = ET.SubElement(result, f"{rns}Error")
            ET.SubElement(err, f"{rns}Key").text = key
            ET.SubElement(err, f"{rns}Code").text = code
            ET.SubElement(err, f"{rns}Message").text = f"injected {code}"
        return status, reason, resp_headers, ET.tostring(result, encoding="utf-8", xml_declaration=True)

    @staticmethod
    def _respond(
        wfile: IO[bytes],
        req: Request,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        content_length: int | None = None,
    ) -> None:
        lines = [f"HTTP/1.1 {status} {reason}"]
        upstream_length = None
        for k, v in headers:
            if k.lower() == "content-length":
                upstream_length = v
            if k.lower() not in _HOP:
                lines.append(f"{k}: {v}")
        if req.method == "HEAD":
            lines.append(f"Content-Length: {upstream_length or 0}")
            body = b""
        else:
            lines.append(f"Content-Length: {content_length if content_length is not None else len(body)}")
        lines.append("Connection: keep-alive")
        wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        wfile.flush()

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        """Close with RST (SO_LINGER 0), as a dropped connection looks to the client."""
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        except OSError:
            pass


def moto_s3_app() -> Callable[..., Any]:
    """moto's S3 as a WSGI application. S3 requests go straight to moto's S3 app: moto's own dispatcher
    works out the service of every request anew (matching the URL patterns of every service it emulates),
    over half of a small request's CPU; its /moto-api paths still reach the dispatcher."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    dispatcher = DomainDispatcherApplication(create_backend_app)
    s3 = create_backend_app("s3")

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO", "").startswith("/moto-api"):
            return dispatcher(environ, start_response)
        return s3(environ, start_response)

    return app


class _Channel(HTTPChannel):
    def send_continue(self) -> None:
        # waitress 3.0 marks the request incomplete after its "100 Continue", so one whose body is empty
        # (botocore's PUT of an empty object) was never served
        request = self.request
        assert request is not None
        completed = request.completed
        super().send_continue()
        request.completed = completed


class _MotoServer(TcpWSGIServer):
    channel_class = _Channel


def serve_moto(host: str, port: int) -> TcpWSGIServer:
    """A waitress server of `moto_s3_app` on host:port (0: a free port), not yet running (`.run()`). Waitress
    keeps connections alive between requests as S3 does (werkzeug's development server, moto's own, closes
    every connection: a TCP connection and a thread per request)."""
    logging.getLogger("waitress").setLevel(logging.ERROR)  # the serving banner; a busy queue is not news here
    return _MotoServer(moto_s3_app(), host=host, port=port, threads=8, ident="moto")


class MotoServer:
    """moto's S3 on 127.0.0.1 with a free port, in a thread of this process (`serve_moto`)."""

    def __init__(self) -> None:
        self._server = serve_moto("127.0.0.1", 0)
        self._thread = threading.Thread(target=self._server.run, name="moto", daemon=True)

    def start(self) -> MotoServer:
        self._thread.start()
        return self

    @property
    def endpoint_url(self) -> str:
        sock = self._server.socket
        assert sock is not None
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    def stop(self) -> None:
        self._server.close()
        self._thread.join(10)


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 in a child process on 127.0.0.1 (its own GIL, like a real endpoint); its URL. For a
    benchmark, or a test measuring its own process (the soak's RSS); `MotoServer` runs in a thread."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "testkit.s3", str(port)],
        cwd=REPOSITORY,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":  # `python -m testkit.s3 PORT`: moto's S3 on 127.0.0.1:PORT (`moto_server`)
    serve_moto("127.0.0.1", int(sys.argv[1])).run()
