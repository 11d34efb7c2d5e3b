/** The status bar, with the stand-in `vscode` module, fed by a real daemon. */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";

import { DAEMON_DOWN_TEXT, statusBarText } from "../src/render";
import { CtxdSessions } from "../src/sessions";
import { SessionStatusBar } from "../src/statusBar";
import {
    startDaemon,
    TEST_SETTINGS,
    tempStateDir,
    type TestDaemon,
    EMPTY_CWD,
} from "./support/daemon";
import { FakeConnection } from "./support/fakeConnection";
import { usageCase } from "./support/fixtures";
import { assistantRecord, userRecord } from "./support/records";
import { fake, type FakeStatusBarItem, MarkdownString, ThemeColor } from "./support/vscode";
import { waitFor } from "./support/wait";

const MODEL = "claude-sonnet-4-5-20250929";

function tooltipText(item: FakeStatusBarItem): string {
    assert.ok(item.tooltip instanceof MarkdownString, "the tooltip is markdown");
    return item.tooltip.value;
}

describe("status bar on a real ctxd", () => {
    let daemon: TestDaemon;
    let sessions: CtxdSessions;
    let statusBar: SessionStatusBar;

    beforeEach(async () => {
        fake.reset();
        daemon = await startDaemon(tempStateDir(), { settings: TEST_SETTINGS });
        sessions = new CtxdSessions();
        sessions.attach(daemon.connection);
        statusBar = new SessionStatusBar(sessions);
    });
    afterEach(async () => {
        statusBar.dispose();
        sessions.dispose();
        await daemon.stop();
    });

    it("shows one item per open session, drawn from the open answer", async () => {
        const a = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const b = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        assert.equal(fake.statusBarItems.length, 2);
        const item = statusBar.item(a.sessionId);
        assert.ok(item !== undefined && statusBar.item(b.sessionId) !== undefined);
        const fakeItem = item as unknown as FakeStatusBarItem;
        assert.equal(fakeItem.visible, true);
        assert.equal(fakeItem.text, "$(dashboard) ctx 0.0% · 67.0k to compact");
        assert.equal(fakeItem.backgroundColor, undefined);
        assert.deepEqual(fakeItem.command, {
            title: "Show context",
            command: "ctxd.showContext",
            arguments: [a.sessionId],
        });
    });

    it("redraws text, colour and tooltip when ctx/usageChanged arrives", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const item = statusBar.item(sessionId) as unknown as FakeStatusBarItem;
        const user = userRecord("hi");
        await sessions.append(sessionId, [user, assistantRecord(50_060, user.uuid as string)]);
        await waitFor("the warning level", () => (item.text.includes("50.1%") ? true : undefined));
        assert.equal(item.text, "$(warning) ctx 50.1% · 16.9k to compact");
        assert.ok(item.backgroundColor instanceof ThemeColor);
        assert.equal(item.backgroundColor.id, "statusBarItem.warningBackground");
        const tooltip = tooltipText(item);
        assert.match(tooltip, /\| Window \| 100,000 \(effective 80,000\) \|/);
        assert.match(tooltip, /\| Auto-compact at \| 67,000 \|/);
        assert.match(tooltip, /\| Tokens \| 50,060 \(reported 50,060, estimated 0\) \|/);
        assert.match(tooltip, /\| Free space \| 16,940 \|/);
    });

    it("removes the item of a closed session", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const item = statusBar.item(sessionId) as unknown as FakeStatusBarItem;
        await sessions.closeSession(sessionId);
        assert.equal(item.disposed, true);
        assert.equal(statusBar.item(sessionId), undefined);
    });

    it("says the daemon is restarting, then draws the last usage again", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const item = statusBar.item(sessionId) as unknown as FakeStatusBarItem;
        statusBar.setDaemonRunning(false);
        assert.equal(item.text, DAEMON_DOWN_TEXT);
        statusBar.setDaemonRunning(true);
        assert.equal(item.text, "$(dashboard) ctx 0.0% · 67.0k to compact");
    });
});

describe("status bar levels the daemon does not reach in a test", () => {
    it("spins while compacting and turns red when blocked", async () => {
        fake.reset();
        const connection = new FakeConnection().answer("ctx/openSession", () => ({
            sessionId: "s-1",
            resumed: false,
            records: 0,
            usage: usageCase("ok").usage,
        }));
        const sessions = new CtxdSessions();
        sessions.attach(connection);
        const statusBar = new SessionStatusBar(sessions);
        await sessions.openSession({ cwd: "/w", model: MODEL });
        const item = statusBar.item("s-1") as unknown as FakeStatusBarItem;

        connection.notify("ctx/usageChanged", {
            sessionId: "s-1",
            usage: usageCase("compacting").usage,
        });
        assert.equal(item.text, "$(sync~spin) ctx 85.0% · compacting");
        assert.equal(item.text, statusBarText(usageCase("compacting").usage));
        assert.equal((item.backgroundColor as ThemeColor).id, "statusBarItem.warningBackground");

        connection.notify("ctx/usageChanged", {
            sessionId: "s-1",
            usage: usageCase("blocked").usage,
        });
        assert.equal(item.text, "$(error) ctx 89.3% · blocked");
        assert.equal((item.backgroundColor as ThemeColor).id, "statusBarItem.errorBackground");

        connection.notify("ctx/usageChanged", {
            sessionId: "other",
            usage: usageCase("blocked").usage,
        });
        assert.equal(
            fake.statusBarItems.length,
            1,
            "no item for a session this editor did not open",
        );
        statusBar.dispose();
    });
});
