"""The packaged extension in a real VS Code build: code-server, driven through Chromium.

    python3 editor-clients/vscode/e2e/smoke.py --code-server DIR --vsix ctxd.vsix --host-vsix host.vsix --ctxd BIN

Installs the .vsix files into a fresh extensions folder, starts code-server on a
workspace whose Claude Code transcript is being appended to, opens it in Chromium
(Debian's, through Playwright) and checks what a user sees: the status item with the
Claude Code session, its update when the transcript grows, the context view it opens,
a window set from the command palette (answered with the reason it was capped), and
the example agent host's session. Prints `smoke: N passed, M failed`.
"""

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

# A model Claude Code auto-compacts (claude-sonnet-4-5 gets no "to compact" figure).
MODEL = "claude-opus-4-6"
WAIT_MS = 60_000


def claude_line(kind: str, context_tokens: int = 0) -> str:
    base = {"uuid": str(uuid.uuid4()), "sessionId": "smoke", "timestamp": "2026-12-01T10:00:00.000Z", "version": "2.1.0"}
    if kind == "user":
        return json.dumps({**base, "type": "user", "message": {"role": "user", "content": "go on"}})
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": context_tokens - 60, "output_tokens": 50}
    message = {"id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "model": MODEL, "content": [{"type": "text", "text": "ok"}], "usage": usage}
    return json.dumps({**base, "type": "assistant", "message": message})


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_palette(page: Page, title: str) -> None:
    page.keyboard.press("F1")
    box = page.locator(".quick-input-widget input")
    expect(box).to_be_visible(timeout=WAIT_MS)
    box.fill(f">{title}")
    expect(page.locator(".quick-input-list .monaco-list-row").first).to_contain_text(title, timeout=WAIT_MS)
    page.keyboard.press("Enter")


class Smoke:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.passed: list[str] = []
        self.failed: list[str] = []

    def check(self, name: str, step) -> None:
        try:
            step()
            self.passed.append(name)
            print(f"ok: {name}", flush=True)
        except Exception:  # noqa: BLE001 (each check reports its own failure)
            self.failed.append(name)
            print(f"FAILED: {name}", flush=True)
            traceback.print_exc()

    def run(self) -> int:
        root = Path(tempfile.mkdtemp(prefix="ctxd-smoke-"))
        claude = root / "claude"
        workspace = root / "work" / "my.app"
        workspace.mkdir(parents=True)
        project = claude / "projects" / re.sub(r"[^A-Za-z0-9]", "-", str(workspace))
        project.mkdir(parents=True)
        transcript = project / f"{uuid.uuid4()}.jsonl"
        transcript.write_text(claude_line("user") + "\n" + claude_line("assistant", 40_000) + "\n")
        data, extensions = root / "data", root / "extensions"
        (data / "User").mkdir(parents=True)
        # User-level settings only: the path of the daemon, a 100k window (known numbers),
        # the offline summarizer, and no trust prompt.
        (data / "User" / "settings.json").write_text(
            json.dumps(
                {
                    "ctxd.path": self.args.ctxd,
                    "ctxd.autoCompactWindow": 100_000,
                    "ctxd.provider": "offline",
                    "security.workspace.trust.enabled": False,
                    "workbench.startupEditor": "none",
                    "extensions.autoCheckUpdates": False,
                    "extensions.autoUpdate": False,
                }
            )
        )
        code_server = str(Path(self.args.code_server) / "node_modules" / ".bin" / "code-server")
        home = root / "home"
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "CLAUDE_CONFIG_DIR": str(claude), "XDG_CONFIG_HOME": str(root / "config"), "XDG_DATA_HOME": str(root / "share")}
        env.pop("ANTHROPIC_API_KEY", None)
        common = ["--user-data-dir", str(data), "--extensions-dir", str(extensions)]
        for vsix in (self.args.vsix, self.args.host_vsix):
            subprocess.run([code_server, *common, "--install-extension", vsix], env=env, check=True, stdout=subprocess.DEVNULL)
        installed = sorted(p.name for p in extensions.iterdir() if p.is_dir())
        print(f"smoke: installed {installed}", flush=True)

        port = free_port()
        log = open(root / "code-server.log", "w")
        server = subprocess.Popen(
            [code_server, *common, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}", "--disable-telemetry", "--disable-workspace-trust", str(workspace)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                time.sleep(0.2)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=self.args.chromium, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/?folder={workspace}")
                self.checks(page, transcript, installed)
                page.screenshot(path=str(root / "last.png"))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()
        if self.failed:
            print(f"smoke: code-server log and screenshot in {root}", flush=True)
        print(f"smoke: {len(self.passed)} passed, {len(self.failed)} failed", flush=True)
        return 1 if self.failed else 0

    def checks(self, page: Page, transcript: Path, installed: list[str]) -> None:
        status = page.locator(".statusbar-item", has_text="ctx 40.0%")

        def both_installed() -> None:
            assert any(n.startswith("ctxd.ctxd-") for n in installed), installed
            assert any(n.startswith("ctxd.ctxd-example-host-") for n in installed), installed

        def claude_session_in_status_bar() -> None:
            expect(status).to_have_count(1, timeout=WAIT_MS)
            expect(status).to_contain_text("ctx 40.0% · 27.0k to compact · 40.0k · claude-opus-4-6")

        def follows_the_transcript() -> None:
            with transcript.open("a") as f:
                f.write(claude_line("user") + "\n" + claude_line("assistant", 60_000) + "\n")
            expect(page.locator(".statusbar-item", has_text="ctx 60.0% · 7.0k to compact · 60.0k")).to_have_count(1, timeout=WAIT_MS)

        def context_view_from_the_item() -> None:
            page.locator(".statusbar-item", has_text="ctx 60.0%").click()
            expect(page.locator(".tab", has_text="observe-")).to_have_count(1, timeout=WAIT_MS)
            lines = page.locator(".editor-instance .view-lines")
            expect(lines).to_contain_text("ctxd context: observe-", timeout=WAIT_MS)
            expect(lines).to_contain_text(f"Claude Code session {transcript.stem}", timeout=WAIT_MS)

        def window_from_the_palette() -> None:
            run_palette(page, "ctxd: Set auto-compact window")
            box = page.locator(".quick-input-widget input")
            expect(box).to_be_visible(timeout=WAIT_MS)
            box.fill("500k")
            page.keyboard.press("Enter")
            toast = page.locator(".notification-toast", has_text="not 500,000")
            expect(toast).to_contain_text("accepts at most 200000 tokens", timeout=WAIT_MS)

        def example_host_session() -> None:
            run_palette(page, "ctxd example host: Run one agent turn")
            # The host's own session takes over: its item shows, the daemon item says ready.
            expect(page.locator(".statusbar-item", has_text="ctx 12.0% · 55.0k to compact")).to_have_count(1, timeout=WAIT_MS)
            expect(page.locator(".statusbar-item", has_text="ctxd ready")).to_have_count(1, timeout=WAIT_MS)

        self.check("both .vsix files install", both_installed)
        self.check("the status bar shows the workspace's Claude Code session", claude_session_in_status_bar)
        self.check("the status bar follows the transcript as it grows", follows_the_transcript)
        self.check("clicking the item opens the context view", context_view_from_the_item)
        self.check("the example agent host opens a session that takes precedence", example_host_session)
        self.check("a window set from the palette is answered with its reason", window_from_the_palette)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code-server", required=True, help="folder where install-code-server put code-server")
    parser.add_argument("--vsix", required=True)
    parser.add_argument("--host-vsix", required=True)
    parser.add_argument("--ctxd", required=True)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    return Smoke(parser.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
