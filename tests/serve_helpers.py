"""Fixtures for the `euler serve` tests: a tiny checkpoint, a real server process, and a
headless browser for the chat page.

The checkpoint is the `tiny` preset with random weights, a tokenizer trained here on a few
generated sentences, and a long context (2048), so that a request can be made to run
long enough for a test to leave in the middle of it. The server is `euler serve` itself
in a subprocess on a free port of 127.0.0.1 (--port 0; it prints the port it took); its
output is collected, so a test can show it and check that no request left a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from euler.tokenizer import Tokenizer

from euler.model.config import get_preset
from euler.model.transformer import Model
from euler.training import checkpoint
from tests.train_helpers import sentences

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120  # a fresh clone compiles the decoding kernels on first use


def tiny_checkpoint(folder: Path, context: int = 2048) -> Path:
    """A run folder holding a random `tiny` model of `context` positions and its tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "text.txt"
    text.write_text("\n".join(sentences(40, seed=1)))
    tok = Tokenizer.train([text], 300)
    cfg = dataclasses.replace(get_preset("tiny"), vocab_size=tok.vocab_size, context=context)
    model = Model(cfg, seed=5)
    params = model.be.to_host(model.params).copy()
    checkpoint.save(folder / checkpoint.CHECKPOINT_NAME, cfg, params, None, {"step": 0}, {},
                    tok.to_json())  # fmt: skip
    return folder


class Server:
    """`euler serve --checkpoint run --port 0 FLAGS` in a subprocess; url once it listens."""

    def __init__(self, run: Path, *flags: str):
        cmd = [sys.executable, "-m", "euler.cli", "serve", "--checkpoint", str(run),
               "--port", "0", *flags]  # fmt: skip
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: list[str] = []
        ready = threading.Event()

        def drain() -> None:  # read every line, so that a full pipe never blocks the server
            for line in self.proc.stdout:
                self.lines.append(line)
                if line.startswith("serving "):
                    self.url = line.split(" at ")[1].split()[0].rstrip("/")
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("euler serve did not start:\n" + self.output)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                key: str | None = None) -> tuple[int, dict]:  # fmt: skip
        """(status, decoded JSON body) of one request made with the standard library."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def wait_for(self, predicate, timeout_s: float = 10.0) -> dict:
        """Poll /health until predicate(its body) holds; the last body (AssertionError on
        time-out)."""
        deadline = time.monotonic() + timeout_s
        while True:
            health = self.request("GET", "/health")[1]
            if predicate(health) or time.monotonic() > deadline:
                assert predicate(health), health
                return health
            time.sleep(0.02)


def browser_paths() -> tuple[str, str]:
    """(chromium, chromedriver): their paths, or the test's failure (its skip with
    EULER_NO_BROWSER=1) naming what is missing: a missing browser never passes silently."""
    found = {name: shutil.which(name) for name in ("chromium", "chromedriver")}
    missing = [name for name, path in found.items() if path is None]
    if not missing:
        return found["chromium"], found["chromedriver"]
    if os.environ.get("EULER_NO_BROWSER") == "1":
        pytest.skip(f"EULER_NO_BROWSER=1 and {', '.join(missing)} missing")
    pytest.fail(f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver "
                "(scripts/test.sh does; or set EULER_NO_BROWSER=1 on a machine that has no "
                "browser)")  # fmt: skip


def headless_chromium():
    """Debian's chromium, headless, driven by Selenium through Debian's chromedriver
    (nothing downloaded at run time), in a 1100 x 760 window; the caller quits it."""
    chromium, chromedriver = browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1100,760"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(chromedriver))


def until(predicate, timeout_s: float = 20.0, what: str = ""):
    """predicate()'s first true value, polled every 10 ms (AssertionError naming `what`
    after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def set_field(driver, field: str, value: str) -> None:
    """Type value into the page's input `field` (by id), replacing what it held."""
    el = driver.find_element("id", field)
    el.clear()
    el.send_keys(value)
