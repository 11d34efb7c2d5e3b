/**
 * The palette commands, with the stand-in `vscode` module: against the real daemon
 * (which answers -32601 for the methods it does not have yet) and against a scripted
 * connection for the answers a future daemon gives.
 */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";

import { Commands, parseWindow, registerCommands, reportCompactions } from "../src/commands";
import { ContextView } from "../src/contextView";
import { CtxdSessions } from "../src/sessions";
import { startDaemon, tempStateDir, type TestDaemon } from "./support/daemon";
import { FakeConnection } from "./support/fakeConnection";
import { renderCases, usageCase } from "./support/fixtures";
import { assistantRecord, userRecord } from "./support/records";
import { fake, window, workspace } from "./support/vscode";

const MODEL = "claude-sonnet-4-5-20250929";

/** Everything the commands need, with `vscode` stood in. */
function setUp(sessions: CtxdSessions) {
    const contextView = new ContextView(sessions);
    const output = window.createOutputChannel("ctxd");
    let restarts = 0;
    const disposables = [
        contextView,
        workspace.registerTextDocumentContentProvider("ctxd-context", contextView),
        ...registerCommands({
            sessions,
            contextView,
            output: output as never,
            restart: async () => {
                restarts += 1;
            },
            defaultModel: () => undefined,
        }),
    ];
    return {
        restarts: () => restarts,
        dispose: () => disposables.forEach((d) => d.dispose()),
    };
}

function run(command: string, ...args: unknown[]): Promise<unknown> {
    const handler = fake.commands.get(command);
    assert.ok(handler, `${command} is registered`);
    return Promise.resolve(handler(...args));
}

function lastError(): string {
    const errors = fake.messages.filter((m) => m.kind === "error");
    assert.ok(errors.length > 0, "an error message was shown");
    return errors[errors.length - 1].text;
}

describe("commands on a real ctxd", () => {
    let daemon: TestDaemon;
    let sessions: CtxdSessions;
    let commands: ReturnType<typeof setUp>;
    let sessionId: string;

    beforeEach(async () => {
        fake.reset();
        daemon = await startDaemon(tempStateDir(), { settings: { autoCompactWindow: 100_000 } });
        sessions = new CtxdSessions();
        sessions.attach(daemon.connection);
        commands = setUp(sessions);
        sessionId = (await sessions.openSession({ cwd: process.cwd(), model: MODEL })).sessionId;
        const user = userRecord("hi");
        await sessions.append(sessionId, [user, assistantRecord(50_060, user.uuid as string)]);
    });
    afterEach(async () => {
        commands.dispose();
        sessions.dispose();
        await daemon.stop();
    });

    it("registers every command package.json contributes", () => {
        assert.deepEqual([...fake.commands.keys()].sort(), Object.values(Commands).sort());
    });

    it("Compact now asks for a focus and shows -32601 as an error, not a crash", async () => {
        fake.inputAnswers.push("keep the failing test output");
        await run(Commands.compact);
        assert.equal(fake.inputBoxes.length, 1);
        assert.deepEqual(fake.progressTitles, ["ctxd: compacting…"]);
        assert.match(lastError(), /^ctxd does not support ctx\/compact yet \(error -32601: .*\)\. Update ctxd to use this command\.$/);
    });

    it("Compact now does nothing when the focus box is dismissed", async () => {
        fake.inputAnswers.push(undefined);
        await run(Commands.compact);
        assert.deepEqual(fake.messages, []);
        assert.deepEqual(fake.progressTitles, []);
    });

    it("Show context falls back to the ctx/usage breakdown and says why", async () => {
        await run(Commands.showContext, sessionId);
        assert.equal(fake.shownDocuments.length, 1);
        const text = fake.shownDocuments[0].getText();
        assert.match(text, new RegExp(`^# ctxd context: ${sessionId}`));
        assert.match(text, /> This ctxd has no ctx\/context yet \(ctxd does not support ctx\/context yet \(error -32601/);
        assert.match(text, /\*\*ctx 62\.6% · 16\.9k to compact\*\*/);
        assert.match(text, /\| Messages: other \| /);
        assert.match(text, /\| Free space \| 16,940 \|/);
        assert.deepEqual(fake.messages, []);
    });

    it("Show context redraws when the daemon sends a new usage", async () => {
        await run(Commands.showContext, sessionId);
        const doc = fake.shownDocuments[0];
        const parent = userRecord("more");
        await sessions.append(sessionId, [parent, assistantRecord(60_000, parent.uuid as string)]);
        const deadline = Date.now() + 5000;
        while (!doc.getText().includes("60,000") && Date.now() < deadline) {
            await new Promise((r) => setTimeout(r, 10));
        }
        assert.match(doc.getText(), /\| Tokens \| 60,000 /);
    });

    it("Set auto-compact window validates the input and shows the daemon's error", async () => {
        fake.inputAnswers.push("200k");
        await run(Commands.setAutoCompactWindow);
        const box = fake.inputBoxes[0];
        assert.equal(box.validateInput?.("lots"), "A positive token count, or auto");
        assert.equal(box.validateInput?.("auto"), undefined);
        assert.match(lastError(), /ctx\/setAutoCompactWindow yet \(error -32601/);
    });

    it("Clear asks first and shows the daemon's error", async () => {
        fake.messageAnswer = "Clear";
        await run(Commands.clear);
        assert.match(fake.messages[0].text, /^Clear ctxd session /);
        assert.match(lastError(), /ctx\/clear yet \(error -32601/);
        assert.deepEqual(sessions.sessions().map((s) => s.sessionId), [sessionId], "the session is kept");
    });

    it("Show log reveals the output channel; Restart restarts", async () => {
        await run(Commands.showLog);
        assert.equal(fake.outputShown, 1);
        await run(Commands.restart);
        assert.equal(commands.restarts(), 1);
    });
});

describe("commands against the answers of a future daemon", () => {
    let connection: FakeConnection;
    let sessions: CtxdSessions;
    let commands: ReturnType<typeof setUp>;

    beforeEach(async () => {
        fake.reset();
        connection = new FakeConnection().answer("ctx/openSession", (p) => ({
            sessionId: (p as { sessionId?: string }).sessionId ?? "s-1",
            resumed: false,
            records: 0,
            usage: usageCase("warning").usage,
        }));
        sessions = new CtxdSessions();
        sessions.attach(connection);
        commands = setUp(sessions);
        await sessions.openSession({ cwd: "/w", model: MODEL });
    });
    afterEach(() => {
        commands.dispose();
        sessions.dispose();
    });

    it("Compact now sends the focus and reports the token drop", async () => {
        connection.answer("ctx/compact", () => ({ boundary: "b", preTokens: 150_000, postTokens: 20_000, summary: "…" }));
        fake.inputAnswers.push("  keep the plan ");
        await run(Commands.compact);
        assert.deepEqual(connection.sent.at(-1), { method: "ctx/compact", params: { sessionId: "s-1", instructions: "keep the plan" } });
        assert.deepEqual(fake.messages, [{ kind: "info", text: "ctxd: compacted 150,000 → 20,000 tokens." }]);
    });

    it("Compact now with an empty focus sends no instructions", async () => {
        connection.answer("ctx/compact", () => ({ boundary: "b", preTokens: 2, postTokens: 1, summary: "" }));
        fake.inputAnswers.push("");
        await run(Commands.compact);
        assert.deepEqual(connection.sent.at(-1), { method: "ctx/compact", params: { sessionId: "s-1" } });
    });

    it("Show context lists memory files with their sizes", async () => {
        connection.answer("ctx/context", () => renderCases.contextCase.context);
        await run(Commands.showContext);
        const text = fake.shownDocuments[0].getText();
        assert.match(text, /## Memory files/);
        assert.ok(text.includes("| /home/dev/project/CLAUDE.md | project | 1,428 | loaded |"));
        assert.doesNotMatch(text, /no ctx\/context yet/);
    });

    it("Set auto-compact window sends the session's model", async () => {
        connection.answer("ctx/setAutoCompactWindow", () => ({ window: 200_000 }));
        fake.inputAnswers.push("200,000");
        await run(Commands.setAutoCompactWindow);
        assert.deepEqual(connection.sent.at(-1), { method: "ctx/setAutoCompactWindow", params: { model: MODEL, window: 200_000 } });
        assert.deepEqual(fake.messages, [{ kind: "info", text: `ctxd: auto-compact window for ${MODEL} is 200,000 tokens.` }]);
    });

    it("Clear moves the session to the new id", async () => {
        connection.answer("ctx/clear", () => ({ sessionId: "s-2" }));
        fake.messageAnswer = "Clear";
        await run(Commands.clear);
        assert.deepEqual(sessions.sessions().map((s) => s.sessionId), ["s-2"]);
    });

    it("asks which session when several are open", async () => {
        await sessions.openSession({ cwd: "/w", model: MODEL, sessionId: "s-9" });
        connection.answer("ctx/context", () => renderCases.contextCase.context);
        fake.quickPick = (items) => items[1];
        await run(Commands.showContext);
        assert.deepEqual(connection.sent.at(-1), { method: "ctx/context", params: { sessionId: "s-9" } });
    });

    it("reports ctx/compacted and ctx/compactFailed", () => {
        const reporting = reportCompactions(sessions);
        connection.notify("ctx/compacted", { sessionId: "s-1", trigger: "auto", preTokens: 170_000, postTokens: 30_000 });
        connection.notify("ctx/compactFailed", { sessionId: "s-1", reason: "Autocompact is thrashing" });
        assert.deepEqual(fake.messages, [
            { kind: "info", text: "ctxd: compacted (auto) 170,000 → 30,000 tokens." },
            { kind: "warning", text: "ctxd: compaction failed: Autocompact is thrashing" },
        ]);
        reporting.forEach((d) => d.dispose());
    });

    it("warns when no session is open", async () => {
        await sessions.closeSession("s-1").catch(() => undefined);
        await run(Commands.compact);
        assert.equal(fake.messages[0].kind, "warning");
        assert.match(fake.messages[0].text, /no session is open/);
    });
});

describe("parseWindow", () => {
    it("reads token counts with k/M suffixes, separators and auto", () => {
        assert.equal(parseWindow("200000"), 200_000);
        assert.equal(parseWindow("200k"), 200_000);
        assert.equal(parseWindow("1M"), 1_000_000);
        assert.equal(parseWindow("1.5m"), 1_500_000);
        assert.equal(parseWindow("200_000"), 200_000);
        assert.equal(parseWindow(" Auto "), "auto");
        assert.equal(parseWindow("0"), undefined);
        assert.equal(parseWindow("lots"), undefined);
        assert.equal(parseWindow("-5"), undefined);
    });
});
