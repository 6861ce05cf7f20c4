"""Headless Chromium driven over the DevTools protocol on a pipe: no driver, no extra Python package.

``--remote-debugging-pipe`` makes Chromium read NUL-terminated JSON commands on fd 3 and write
replies and events on fd 4. That is all a test needs to load a page, collect what the console
and the runtime report, evaluate JavaScript and take a full-page screenshot.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio"]


def find() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One Chromium process with a fresh profile; ``with Browser() as b: page = b.open(url)``."""

    def __init__(self, executable: str, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="dagprof-chromium-")
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, fd 4 carries its replies
            a, b = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child))  # out of the way of 3 and 4 first
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     close_fds=False, preexec_fn=fds)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.send("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, session: str | None = None, **params) -> dict:
        """Send a command and return its result; events that arrive meanwhile are kept in ``events``."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._next(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str, timeout_s: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        for e in self.events:
            if e.get("method") == method and e.get("sessionId") == session:
                return e
        while True:
            e = self._next(deadline)
            self.events.append(e)
            if e.get("method") == method and e.get("sessionId") == session:
                return e

    def _next(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def open(self, url: str, width: int = 1200, height: int = 900) -> Page:
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session)
        self.send("Emulation.setDeviceMetricsOverride", session, width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.send("Page.navigate", session, url=url)
        self.wait_for("Page.loadEventFired", session)
        return Page(self, session)


class Page:
    def __init__(self, browser: Browser, session: str):
        self.b, self.session = browser, session

    def eval(self, expression: str):
        r = self.b.send("Runtime.evaluate", self.session, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression!r}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def problems(self) -> list[str]:
        """Everything the page reported as wrong: uncaught exceptions, console errors and warnings, failed loads."""
        out = []
        for e in self.b.events:
            if e.get("sessionId") != self.session:
                continue
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')}")
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: {' '.join(str(a.get('value', a.get('description'))) for a in p.get('args', []))}")
            elif e["method"] == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                out.append(f"{p['entry'].get('source')} {p['entry']['level']}: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
        return out

    def screenshot(self, path: str) -> tuple[int, int]:
        """The whole page (not just the window) as PNG; returns its CSS size."""
        size = self.b.send("Page.getLayoutMetrics", self.session)["cssContentSize"]
        w, h = int(size["width"]), int(size["height"])
        data = self.b.send("Page.captureScreenshot", self.session, format="png", captureBeyondViewport=True,
                           clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return w, h
