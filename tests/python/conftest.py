"""Fixtures for the OpenAI-client tests: `onebit serve` processes on free ports.

ONEBIT: the binary (default: target/release/onebit in this checkout).
MODEL:  the GGUF to serve (default: the demo model in onebit's cache,
        ${XDG_CACHE_HOME:-~/.cache}/onebit/models/SmolLM2-135M-Instruct.Q4_1.gguf).
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onebit"
BINARY = Path(os.environ.get("ONEBIT") or ROOT / "target" / "release" / "onebit")
MODEL = Path(os.environ.get("MODEL") or CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
API_KEY = "onebit-test-key"


def _die_with_parent():
    """In the child, before exec: get SIGTERM when pytest dies, so no server outlives a killed run."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `onebit serve` process, its root URL, and its log."""

    def __init__(self, *extra):
        if not BINARY.is_file():
            pytest.fail(f"no onebit binary at {BINARY} (build it with `cargo build --release` or set ONEBIT)")
        if not MODEL.is_file():
            pytest.fail(f"no model at {MODEL} (run `make fetch-model` or set MODEL)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="onebit-serve-", suffix=".log", delete=False)
        cmd = [str(BINARY), "serve", "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", "2", *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.wait_ready(cmd)

    def log_text(self):
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def wait_ready(self, cmd, timeout=60.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"`{' '.join(cmd)}` exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                status, body = http(self.url + "/health")
                last = (status, body)
                if status == 200:
                    assert body == {"status": "ok"}, body
                    return
                # While the model loads: 503 in the usual error shape.
                assert status == 503 and body["error"]["type"] == "unavailable_error", body
            except (ConnectionError, urllib.error.URLError, socket.timeout) as e:
                last = e
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"server not ready after {timeout} s (last: {last}):\n{self.log_text()}")

    def client(self, api_key="unused", **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60, **kw)

    def stop(self):
        """Stop the server; a server that died on its own fails the session with its log."""
        died = self.proc.poll()
        if died is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        log = self.log_text()
        self.log.close()
        if died is not None:
            print(f"\nonebit serve exited with {died} during the tests; log kept at {self.log.name}:\n{log}")
            pytest.fail(f"onebit serve exited with {died} during the tests (log: {self.log.name})")
        os.unlink(self.log.name)


def http(url, body=None, headers=None, method=None):
    """A plain request (for what the OpenAI client has no method for): (status, parsed JSON)."""
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


@pytest.fixture(scope="session")
def server():
    s = Server("--parallel", "4")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    return server.client()


@pytest.fixture(scope="session")
def model_id(client):
    return client.models.list().data[0].id


SMALL_CTX = 256


@pytest.fixture(scope="session")
def small_server():
    """A key, one sequence of a small context, and no queue: auth, context and busy errors."""
    s = Server("--parallel", "1", "--queue-size", "0", "-c", str(SMALL_CTX), "--api-key", API_KEY)
    yield s
    s.stop()
