"""The packaged extension in a real VS Code build: code-server, driven through Chromium.

    python3 editor-clients/vscode/e2e/smoke.py --code-server DIR --vsix ctxd.vsix --host-vsix host.vsix --ctxd BIN

Installs the .vsix files into a fresh extensions folder, starts code-server on a
workspace whose Claude Code transcript is being appended to, opens it in Chromium
(Debian's, through Playwright) and checks what a user sees: the status item with the
Claude Code session (the workspace is opened through a symlink to a folder whose name
has a character outside the Basic Multilingual Plane, so the project folder is found as
Claude Code names it), its update when the transcript grows, the context view it opens,
a window set from the command palette (answered with the reason it was capped), the
example agent host's session, `ctxd.observeClaudeCode` turned off and on with no
reload, "Clear session" on a Claude Code session, and a daemon that exits at start
(named in the item, no raw toast of the language client, the notification gone once
it runs again). Prints `smoke: N passed, M failed`.
"""

import argparse
import contextlib
import json
import os
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
# The settings' defaults, as the extension contributes them.
DEFAULTS = {
    key: spec.get("default")
    for key, spec in json.loads((Path(__file__).resolve().parents[1] / "package.json").read_text())["contributes"]["configuration"]["properties"].items()
}


def claude_line(kind: str, context_tokens: int = 0) -> str:
    base = {"uuid": str(uuid.uuid4()), "sessionId": "smoke", "timestamp": "2026-12-01T10:00:00.000Z", "version": "2.1.0"}
    if kind == "user":
        return json.dumps({**base, "type": "user", "message": {"role": "user", "content": "go on"}})
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": context_tokens - 60, "output_tokens": 50}
    message = {"id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "model": MODEL, "content": [{"type": "text", "text": "ok"}], "usage": usage}
    return json.dumps({**base, "type": "assistant", "message": message})


def project_folder_name(cwd: str) -> str:
    """Claude Code's name for the project folder of `cwd` (a real path under 200 UTF-16
    units): each UTF-16 unit that is not an ASCII letter or digit becomes `-`."""
    return "".join(c if c.isascii() and c.isalnum() else "-" * (len(c.encode("utf-16-le")) // 2) for c in cwd)


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
        # The editor opens a symlink; Claude Code, started in it, names the project after
        # the real path, whose last name has a character outside the BMP (two dashes).
        real = root / "work" / "café-😀 app"
        real.mkdir(parents=True)
        workspace = root / "work" / "my.app"
        workspace.symlink_to(real)
        project = claude / "projects" / project_folder_name(str(real.resolve()))
        assert project.name.endswith("-caf-----app"), project.name
        project.mkdir(parents=True)
        transcript = project / f"{uuid.uuid4()}.jsonl"
        transcript.write_text(claude_line("user") + "\n" + claude_line("assistant", 40_000) + "\n")
        data, extensions = root / "data", root / "extensions"
        (data / "User").mkdir(parents=True)
        # User-level settings only: the path of the daemon, a 100k window (known numbers),
        # the offline summarizer, and no trust prompt.
        self.settings_file = data / "User" / "settings.json"
        self.settings = {
            "ctxd.path": self.args.ctxd,
            "ctxd.autoCompactWindow": 100_000,
            "ctxd.provider": "offline",
            "security.workspace.trust.enabled": False,
            "workbench.startupEditor": "none",
            "extensions.autoCheckUpdates": False,
            "extensions.autoUpdate": False,
        }
        self.settings_file.write_text(json.dumps(self.settings))
        self.root = root
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

        def set_setting(key: str, value) -> None:
            # As a user does it: the Settings editor, searched for the key. (code-server does
            # not see a settings.json changed on disk behind its back.)
            run_palette(page, "Preferences: Open Settings (UI)")
            editor = page.locator(".settings-editor")
            expect(editor).to_be_visible(timeout=WAIT_MS)
            page.keyboard.press("Control+a")
            page.keyboard.type(key)
            item = editor.locator(".settings-tree-container .setting-item-contents").first
            expect(item).to_contain_text(key.split(".")[-1][:4], ignore_case=True, timeout=WAIT_MS)
            if isinstance(value, bool):
                checkbox = item.locator(".setting-value-checkbox")
                if (checkbox.get_attribute("aria-checked") == "true") != value:
                    checkbox.click()
                expect(checkbox).to_have_attribute("aria-checked", "true" if value else "false", timeout=WAIT_MS)
            else:
                box = item.locator("input").first
                box.fill(str(value))
                box.press("Enter")
                expect(box).to_have_value(str(value), timeout=WAIT_MS)
            # The editor writes the user's settings.json a moment later (a default by
            # taking the key out).
            default = DEFAULTS[key]

            def saved() -> bool:
                return json.loads(self.settings_file.read_text() or "{}").get(key, default) == value

            deadline = time.monotonic() + WAIT_MS / 1000
            while not saved() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert saved(), f"{key} was not saved"
            page.locator(".tabs-container .tab.active .tab-actions .action-label").click()
            expect(editor).to_have_count(0, timeout=WAIT_MS)

        toasts = page.locator(".notifications-toasts .notification-toast")

        def observe_setting_applies_at_once() -> None:
            claude_item = page.locator(".statusbar-item", has_text="ctx 60.0% · 7.0k to compact · 60.0k")
            expect(claude_item).to_have_count(1, timeout=WAIT_MS)
            set_setting("ctxd.observeClaudeCode", False)
            expect(claude_item).to_have_count(0, timeout=WAIT_MS)
            expect(page.locator(".statusbar-item", has_text="ctxd ready")).to_have_count(1, timeout=WAIT_MS)
            set_setting("ctxd.observeClaudeCode", True)
            expect(claude_item).to_have_count(1, timeout=WAIT_MS)
            expect(toasts.filter(has_text="reload")).to_have_count(0)

        def clear_on_a_claude_session_explains() -> None:
            run_palette(page, "ctxd: Clear session")
            toast = toasts.filter(has_text="Type /clear in Claude Code")
            expect(toast).to_have_count(1, timeout=WAIT_MS)
            expect(toast).to_contain_text("Compact it instead")
            expect(toasts.filter(has_text="no Claude Code session was found")).to_have_count(0)

        def failed_start_is_told_plainly_and_recovers() -> None:
            exits = self.root / "ctxd-exits"
            exits.write_text("#!/bin/sh\necho 'ctxd: cannot open the state directory' >&2\nexit 3\n")
            exits.chmod(0o755)
            set_setting("ctxd.path", str(exits))
            run_palette(page, "ctxd: Restart daemon")
            failed = page.locator(".statusbar-item", has_text="ctxd failed: exited with code 3 · retrying in")
            expect(failed).to_have_count(1, timeout=WAIT_MS)
            notice = toasts.filter(has_text="ctxd did not start")
            expect(notice).to_have_count(1, timeout=WAIT_MS)
            expect(notice).to_contain_text("cannot open the state directory")
            page.screenshot(path=str(self.root / "failed-start.png"))
            # The language client's own words never reach the user.
            for raw in ("EPIPE", "erroring", "-32099", "initialization failed", "will not be restarted", "couldn't create connection"):
                expect(toasts.filter(has_text=raw)).to_have_count(0)
            set_setting("ctxd.path", self.args.ctxd)
            expect(page.locator(".statusbar-item", has_text="ctx 60.0%")).to_have_count(1, timeout=WAIT_MS)
            expect(notice).to_have_count(0, timeout=WAIT_MS)

        self.check("both .vsix files install", both_installed)
        self.check("the status bar shows the workspace's Claude Code session", claude_session_in_status_bar)
        self.check("the status bar follows the transcript as it grows", follows_the_transcript)
        self.check("clicking the item opens the context view", context_view_from_the_item)
        self.check("ctxd.observeClaudeCode turned off and on applies at once", observe_setting_applies_at_once)
        self.check("Clear session on a Claude Code session says what to do instead", clear_on_a_claude_session_explains)
        self.check("a daemon that exits at start is told plainly, retried, and the notice goes once it runs", failed_start_is_told_plainly_and_recovers)
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
