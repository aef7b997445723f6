"""Headless Debian ``chromium`` driven over the Chrome DevTools protocol (websocket-client).

``Browser(artifacts)`` starts it with a throw-away profile; ``open(url)``, ``eval(js)``,
``wait_for(js)``, ``type_into(selector, text)``, ``fill(selector, text)``, ``click(selector)`` and
``screenshot(name)`` (PNG under ``artifacts``) drive one page.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests
import websocket

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--remote-debugging-port=0",
    "--window-size=1400,900",
]


class Browser:
    def __init__(self, artifacts: Path) -> None:
        self.artifacts = artifacts
        self.profile = Path(tempfile.mkdtemp(prefix="trainops-chromium-"))
        self.process = subprocess.Popen(
            [
                shutil.which("chromium") or "chromium",
                *FLAGS,
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(artifacts / "chromium.log").open("w"),
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            assert self.process.poll() is None, (
                f"chromium exited ({self.process.returncode}); see {artifacts}"
            )
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        page = next(
            t
            for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            if t["type"] == "page"
        )
        self.socket = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True
        )
        self.ids = itertools.count(1)
        self.send("Page.enable")

    def send(self, method: str, **params) -> dict:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        number = next(self.ids)
        self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == number:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def eval(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, f"{expression}: {result['exceptionDetails']}"
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """Click the element ``selector`` (as a person does: React's handlers run)."""
        assert self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e && e.click(); return !!e; }})()"
        ), f"no {selector} to click"

    def fill(self, selector: str, text: str) -> None:
        """Replace the value of the input ``selector`` with ``text`` the way typing does, so that React sees it."""
        script = (
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return false;"
            " Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(e, "
            f"{json.dumps(text)}); e.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})()"
        )
        assert self.eval(script), f"no input {selector}"

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element ``selector`` and type ``text`` into it (DevTools input events)."""
        assert self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); return e === document.activeElement; }})()"
        )
        self.send("Input.insertText", text=text)

    def wait_for(self, expression: str, timeout_s: float = 60):
        """Poll ``expression`` in the page until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        while not (value := self.eval(expression)):
            if time.monotonic() > deadline:
                self.screenshot("timeout")
                raise AssertionError(
                    f"page never satisfied {expression!r}; body: {self.eval('document.body && document.body.innerText')!r:.2000}"
                )
            time.sleep(0.3)
        return value

    def screenshot(self, name: str) -> Path:
        path = self.artifacts / f"{name}.png"
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)
