"""Open an HTML file in headless Chromium (Debian's `chromium`; `make chromium` installs it) and report what
happened, over the DevTools protocol (CDP) on a 127.0.0.1 port, with aiohttp's websocket client.

`open_page(path, png)` returns console errors and exceptions, every network request the page made (an
offline report makes none: only its own file:// URL), per `svg.plot` the number of drawn marks with a
non-empty box and its drawn width (CSS px), and saves a full-page screenshot. The browser is started with
its own profile folder and stopped by its PID.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

# Per plot: its id, title, and how many `.mark` elements have a box of positive size.
PLOTS_JS = """JSON.stringify(Array.from(document.querySelectorAll('svg.plot')).map(s => ({
  id: s.id, title: (s.querySelector('title') || {}).textContent,
  width: s.getBoundingClientRect().width,
  marks: Array.from(s.querySelectorAll('.mark')).filter(m => { const b = m.getBBox();
    return (b.width > 0 || b.height > 0) && m.getClientRects().length > 0; }).length})))"""


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise RuntimeError("chromium is not installed: `make chromium` installs Debian's package")
    return exe


@dataclass
class PageReport:
    errors: list[str] = field(default_factory=list)     # console errors, exceptions, log entries of level error
    requests: list[str] = field(default_factory=list)   # every URL the page asked for
    plots: list[dict] = field(default_factory=list)
    screenshot: Path | None = None


def open_page(html: Path, png: Path, *, width: int = 1100, timeout_s: float = 60.0, tile_px: int = 0) -> PageReport:
    """tile_px > 0 also saves the page in tiles of that height (png stem + .N.png), for reading by eye."""
    # chromium's helper processes may still be writing to the profile for a moment after it exits
    with tempfile.TemporaryDirectory(prefix="lg-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 "--disable-extensions", "--disable-background-networking", "--disable-sync",
                                 "--disable-component-update", "--disable-default-apps",
                                 "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                                 f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "TMPDIR": profile},   # its temporary files go with the profile
                                start_new_session=True)                  # its own process group: stopped together
        try:
            ws_url = _devtools_url(Path(profile), proc, timeout_s)
            return asyncio.run(asyncio.wait_for(_drive(ws_url, html.resolve(), png, width, tile_px), timeout_s))
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    # the browser and its helpers (renderer, zygote, GPU) share the group we started it in
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
            time.sleep(0.2)          # helpers leave after the browser
        except subprocess.TimeoutExpired:
            continue


def _devtools_url(profile: Path, proc: subprocess.Popen, timeout_s: float) -> str:
    # Chromium writes the port it bound and the browser's websocket path to DevToolsActivePort.
    deadline = time.monotonic() + timeout_s
    f = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode} before it opened its debugging port")
        if f.is_file():
            lines = f.read_text().split()
            if len(lines) >= 2:
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        time.sleep(0.05)
    raise RuntimeError("chromium did not open its debugging port")


class _Cdp:
    def __init__(self, ws):
        self.ws, self.next_id, self.pending, self.events = ws, 0, {}, []

    async def pump(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def call(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        await self.ws.send_str(json.dumps(msg))
        reply = await fut
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def wait_event(self, method: str, timeout_s: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.events:
                if e.get("method") == method:
                    return e
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no {method} event")


async def _drive(ws_url: str, html: Path, png: Path, width: int, tile_px: int) -> PageReport:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        cdp = _Cdp(ws)
        pump = asyncio.create_task(cdp.pump())
        try:
            target = await cdp.call("Target.createTarget", url="about:blank")
            sid = (await cdp.call("Target.attachToTarget", targetId=target["targetId"], flatten=True))["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                await cdp.call(f"{domain}.enable", sid)
            await cdp.call("Page.navigate", sid, url=html.as_uri())
            await cdp.wait_event("Page.loadEventFired")
            await asyncio.sleep(0.3)   # late console messages
            plots = json.loads((await cdp.call("Runtime.evaluate", sid, expression=PLOTS_JS,
                                               returnByValue=True))["result"]["value"])
            metrics = await cdp.call("Page.getLayoutMetrics", sid)
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            shot = await cdp.call("Page.captureScreenshot", sid, format="png", captureBeyondViewport=True,
                                  clip={"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1})
            png.write_bytes(base64.b64decode(shot["data"]))
            for i, y in enumerate(range(0, int(size["height"]), tile_px) if tile_px else ()):
                tile = await cdp.call("Page.captureScreenshot", sid, format="png", captureBeyondViewport=True,
                                      clip={"x": 0, "y": y, "width": width, "height": tile_px, "scale": 1})
                png.with_suffix(f".{i}.png").write_bytes(base64.b64decode(tile["data"]))
        finally:
            pump.cancel()
    rep = PageReport(plots=plots, screenshot=png)
    for e in cdp.events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            rep.errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            rep.errors.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            rep.errors.append("log: " + p["entry"].get("text", ""))
        elif m == "Network.requestWillBeSent":
            rep.requests.append(p["request"]["url"])
    return rep
