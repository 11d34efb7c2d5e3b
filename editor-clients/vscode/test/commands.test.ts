/**
 * The palette commands, with the stand-in `vscode` module: against the real daemon
 * (which answers -32601 for the methods it does not have yet), and against a scripted
 * connection for what the real one cannot give: the answers of a future daemon
 * (`ctx/compact`, `ctx/clear`) and those of an older one (no `ctx/context`).
 */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";

import {
    Commands,
    OLD_DAEMON_NOTE,
    parseWindow,
    registerCommands,
    reportCompactions,
    undoClaude,
} from "../src/commands";
import { ContextView } from "../src/contextView";
import type {
    CompactedNotification,
    CompactResult,
    ContextChangedNotification,
    ContextResult,
} from "../src/lsp_ext";
import { formatCount, statusText, windowResultText } from "../src/render";
import { CtxdSessions } from "../src/sessions";
import {
    packageRoot,
    startDaemon,
    TEST_SETTINGS,
    tempStateDir,
    type TestDaemon,
} from "./support/daemon";
import { FakeConnection } from "./support/fakeConnection";
import { renderCases, usageCase } from "./support/fixtures";
import { makeProject, type TestProject, writeAtomically } from "./support/project";
import { assistantRecord, userRecord } from "./support/records";
import { fake, window, workspace } from "./support/vscode";
import { settled, waitFor } from "./support/wait";

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

/** The markdown table row of a memory file, as the context view escapes it. */
function memoryRow(file: { path: string; kind: string; tokens: number; status: string }): string {
    return `| ${file.path} | ${file.kind} | ${formatCount(file.tokens)} | ${file.status} |`;
}

describe("commands on a real ctxd", () => {
    let daemon: TestDaemon;
    let sessions: CtxdSessions;
    let commands: ReturnType<typeof setUp>;
    let sessionId: string;
    let project: TestProject;

    beforeEach(async () => {
        fake.reset();
        project = makeProject();
        daemon = await startDaemon(tempStateDir(), { settings: TEST_SETTINGS });
        sessions = new CtxdSessions();
        sessions.attach(daemon.connection);
        commands = setUp(sessions);
        sessionId = (await sessions.openSession({ cwd: project.dir, model: MODEL })).sessionId;
        const user = userRecord("hi");
        await sessions.append(sessionId, [user, assistantRecord(50_060, user.uuid as string)]);
        await waitFor("the usage after the append", () =>
            sessions.latestUsage(sessionId)?.tokens === 50_060 ? true : undefined,
        );
    });
    afterEach(async () => {
        commands.dispose();
        sessions.dispose();
        await daemon.stop();
    });

    it("registers every command package.json contributes", () => {
        const manifest = JSON.parse(
            fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"),
        ) as {
            contributes: { commands: { command: string }[] };
        };
        const contributed = manifest.contributes.commands.map((c) => c.command).sort();
        assert.ok(contributed.length > 0, "package.json contributes commands");
        assert.deepEqual([...fake.commands.keys()].sort(), contributed);
        assert.deepEqual(Object.values(Commands).sort(), contributed);
    });

    it("Compact now asks for a focus, compacts, and reports the token drop; the session follows", async () => {
        const compacted: CompactedNotification[] = [];
        sessions.onCompacted((c) => compacted.push(c));
        fake.inputAnswers.push("keep the failing test output");
        await run(Commands.compact);
        assert.equal(fake.inputBoxes.length, 1);
        assert.deepEqual(fake.progressTitles, ["ctxd: compacting…"]);
        assert.equal(fake.messages.length, 1, JSON.stringify(fake.messages));
        const [message] = fake.messages;
        assert.equal(message.kind, "info");
        const drop = /^ctxd: compacted ([\d,]+) → ([\d,]+) tokens\.$/.exec(message.text);
        assert.ok(drop, message.text);
        const [pre, post] = [drop[1], drop[2]].map((n) => Number(n.replace(/,/g, "")));
        // The transcript's last report (50,060) already holds the memory files.
        assert.ok(pre >= 50_060 && post < 50_060, message.text);
        await waitFor("ctx/compacted", () => (compacted.length > 0 ? true : undefined));
        assert.deepEqual(compacted, [
            { sessionId, trigger: "manual", preTokens: pre, postTokens: post },
        ]);
        const usage = await waitFor("the usage after the compaction", () => {
            const u = sessions.latestUsage(sessionId);
            return u !== undefined && u.tokens < 50_060 && u.level !== "compacting" ? u : undefined;
        });
        assert.equal(usage.level, "ok");
    });

    it("Compact now shows the daemon's error (nothing to compact)", async () => {
        const empty = await sessions.openSession({ cwd: project.dir, model: MODEL });
        fake.inputAnswers.push("");
        await run(Commands.compact, empty.sessionId);
        assert.match(
            lastError(),
            /^ctxd could not compact the session: nothing to compact: .*\. Nothing was changed\.$/,
        );
    });

    it("Undo last compaction brings the tokens back, and says why when it cannot", async () => {
        await run(Commands.undoCompact);
        assert.equal(
            lastError(),
            "ctxd could not undo the compaction: this session has no compaction to undo.",
        );
        fake.inputAnswers.push("");
        await run(Commands.compact);
        fake.messages.length = 0;
        await run(Commands.undoCompact);
        assert.equal(fake.messages.length, 1, JSON.stringify(fake.messages));
        const undone = /^ctxd: compaction undone; ([\d,]+) → ([\d,]+) tokens\.$/.exec(
            fake.messages[0].text,
        );
        assert.ok(undone, fake.messages[0].text);
        const [pre, post] = [undone[1], undone[2]].map((n) => Number(n.replace(/,/g, "")));
        assert.ok(pre < 50_060 && post >= 50_060, fake.messages[0].text);
        await waitFor("the usage after the undo", () =>
            sessions.latestUsage(sessionId)?.tokens === post ? true : undefined,
        );
        await run(Commands.undoCompact);
        assert.match(lastError(), /^ctxd could not undo the compaction: /);
    });

    it("Compact now does nothing when the focus box is dismissed", async () => {
        fake.inputAnswers.push(undefined);
        await run(Commands.compact);
        assert.deepEqual(fake.messages, []);
        assert.deepEqual(fake.progressTitles, []);
    });

    it("Show context lists the memory files with their token sizes and the waiting rule (ctx/context)", async () => {
        await run(Commands.showContext, sessionId);
        assert.deepEqual(fake.messages, []);
        assert.equal(fake.shownDocuments.length, 1);
        const text = fake.shownDocuments[0].getText();
        const answer = await sessions.context(sessionId);
        assert.match(
            text,
            new RegExp(
                `^# ctxd context: ${sessionId}\n\n\\*\\*ctx 50\\.1% · 16\\.9k to compact\\*\\*`,
            ),
            "no note",
        );
        const claudeMd = answer.memoryFiles.find((f) => f.path === project.claudeMd);
        assert.ok(
            claudeMd !== undefined && claudeMd.tokens > 0,
            JSON.stringify(answer.memoryFiles),
        );
        assert.deepEqual([claudeMd.kind, claudeMd.status], ["project", "loaded"]);
        assert.ok(text.includes(memoryRow(claudeMd)), text);
        const rule = answer.memoryFiles.find((f) => f.path === project.rule);
        assert.ok(
            rule !== undefined && rule.status === "waiting",
            JSON.stringify(answer.memoryFiles),
        );
        assert.ok(text.includes(memoryRow(rule)), text);
        assert.ok(
            text.includes(
                `## Pending rules\n\n| Rule | Applies to |\n| --- | --- |\n| ${project.rule} | src/\\*\\*/\\*.rs |`,
            ),
            text,
        );
        // ctx/context and ctx/usageChanged carry the same breakdown.
        assert.ok(answer.usage.breakdown.memoryFiles > 0);
        assert.equal(
            sessions.latestUsage(sessionId)?.breakdown.memoryFiles,
            answer.usage.breakdown.memoryFiles,
        );
        assert.ok(
            text.includes(`| Memory files | ${formatCount(answer.usage.breakdown.memoryFiles)} |`),
            text,
        );
        assert.match(
            text,
            /\| Files read \| 0 \|\n\| Changed since read \| 0 \|\n\| Git snapshot \| no \|/,
        );
    });

    it("Show context follows ctx/contextChanged when a memory file or a read file changes on disk", async () => {
        const changed: ContextChangedNotification[] = [];
        sessions.onContextChanged((c) => changed.push(c));
        await run(Commands.showContext, sessionId);
        const doc = fake.shownDocuments[0];
        const read = await sessions.fileRead({
            sessionId,
            path: project.notes,
            startLine: 2,
            numLines: 1,
        });
        assert.deepEqual(
            {
                alreadyRead: read.alreadyRead,
                reads: read.reads,
                startLine: read.startLine,
                numLines: read.numLines,
                totalLines: read.totalLines,
            },
            { alreadyRead: false, reads: 1, startLine: 2, numLines: 1, totalLines: 3 },
        );
        writeAtomically(project.notes, "uno\ndos\ntres\n");
        writeAtomically(
            project.claudeMd,
            `# Project\n\n${"Run the tests before every commit. ".repeat(40)}\n`,
        );
        await waitFor("ctx/contextChanged for both files", () => {
            const paths = changed.filter((c) => c.sessionId === sessionId).flatMap((c) => c.paths);
            return paths.includes(project.notes) && paths.includes(project.claudeMd)
                ? true
                : undefined;
        });
        // The daemon's state once both changes are in; the view asked again after each
        // notification, so it ends on that state too.
        let answer = await sessions.context(sessionId);
        const grown = (a: ContextResult) =>
            (a.memoryFiles.find((f) => f.path === project.claudeMd)?.tokens ?? 0) > 100;
        for (
            const deadline = Date.now() + 10_000;
            !(grown(answer) && answer.staleFiles?.includes(project.notes));
        ) {
            assert.ok(
                Date.now() < deadline,
                `the daemon's context after the changes: ${JSON.stringify(answer)}`,
            );
            await new Promise((r) => setTimeout(r, 50));
            answer = await sessions.context(sessionId);
        }
        const claudeMd = answer.memoryFiles.find((f) => f.path === project.claudeMd)!;
        assert.deepEqual(answer.staleFiles, [project.notes]);
        await waitFor("the view to show the new state", () => {
            const text = doc.getText();
            return text.includes(memoryRow(claudeMd)) &&
                text.includes(`## Changed since read\n\n- ${project.notes}\n`)
                ? true
                : undefined;
        });
        assert.match(doc.getText(), /\| Files read \| 1 \|\n\| Changed since read \| 1 \|/);
        assert.deepEqual(fake.messages, []);
    });

    it("Show context redraws when the daemon sends a new usage", async () => {
        await run(Commands.showContext, sessionId);
        const doc = fake.shownDocuments[0];
        const parent = userRecord("more");
        await sessions.append(sessionId, [parent, assistantRecord(60_000, parent.uuid as string)]);
        await waitFor("the view at 60,000 tokens", () =>
            doc.getText().includes("| Tokens | 60,000 ") ? true : undefined,
        );
        assert.match(doc.getText(), /\*\*ctx 60\.0% · 7\.0k to compact\*\*/);
        assert.match(doc.getText(), /## Memory files/, "still the ctx/context view");
    });

    it("Set auto-compact window validates the input, saves the window, and the session follows", async () => {
        fake.inputAnswers.push("200k");
        await run(Commands.setAutoCompactWindow);
        const box = fake.inputBoxes[0];
        assert.equal(box.validateInput?.("lots"), "A positive token count, or auto");
        assert.equal(box.validateInput?.("auto"), undefined);
        assert.deepEqual(fake.messages, [
            {
                kind: "info",
                text: `ctxd: auto-compact window for ${MODEL} is 200,000 tokens (from settings).`,
            },
        ]);
        // The daemon applies the saved window to the model's open sessions at once.
        const usage = await waitFor("the session at a 200,000 window", () => {
            const u = sessions.latestUsage(sessionId);
            return u?.window === 200_000 ? u : undefined;
        });
        assert.equal(statusText(usage), "ctx 25.0% · 116.9k to compact");
        const saved = JSON.parse(
            fs.readFileSync(path.join(daemon.stateDir, "saved-settings.json"), "utf8"),
        );
        assert.deepEqual(saved.modelSettings[MODEL], { autoCompactWindow: 200_000 });
    });

    it("Set auto-compact window shows the daemon's warnings; auto clears the saved window", async () => {
        fake.inputAnswers.push("2M");
        await run(Commands.setAutoCompactWindow);
        // Capped to the model's window: the reason says so, in place of the clamp warning.
        assert.deepEqual(fake.messages, [
            {
                kind: "warning",
                text: "ctxd: window 200,000, not 2,000,000: the model accepts at most 200000 tokens; 2000000 is more than it can take.",
            },
            {
                kind: "info",
                text: `ctxd: auto-compact window for ${MODEL} is 200,000 tokens (from settings).`,
            },
        ]);
        await waitFor("the session at a 200,000 window", () =>
            sessions.latestUsage(sessionId)?.window === 200_000 ? true : undefined,
        );
        fake.messages = [];
        fake.inputAnswers.push("auto");
        await run(Commands.setAutoCompactWindow);
        // Back to the client's autoCompactWindow setting.
        assert.deepEqual(fake.messages, [
            {
                kind: "info",
                text: `ctxd: auto-compact window for ${MODEL} is 100,000 tokens (from settings).`,
            },
        ]);
        await waitFor("the session at a 100,000 window", () =>
            sessions.latestUsage(sessionId)?.window === 100_000 ? true : undefined,
        );
        assert.equal(statusText(sessions.latestUsage(sessionId)!), "ctx 50.1% · 16.9k to compact");
    });

    it("Set auto-compact window shows the daemon's error", async () => {
        // A directory where the daemon saves windows: it cannot write there.
        fs.mkdirSync(path.join(daemon.stateDir, "saved-settings.json"));
        fake.inputAnswers.push("300k");
        await run(Commands.setAutoCompactWindow);
        assert.match(
            lastError(),
            /^ctxd could not save the auto-compact window: ctxd could not read or write its store \(.*saved-settings\.json.*\)\. The daemon's log has more\.$/,
        );
        assert.equal(sessions.latestUsage(sessionId)?.window, 100_000, "nothing changed");
    });

    it("Clear asks first, then starts a new empty session in its place", async () => {
        fake.messageAnswer = "Clear";
        await run(Commands.clear);
        assert.match(fake.messages[0].text, /^Clear ctxd session /);
        assert.equal(fake.messages.length, 2, JSON.stringify(fake.messages));
        const cleared = /^ctxd: cleared; the new session is (\S+)\.$/.exec(fake.messages[1].text);
        assert.ok(cleared, fake.messages[1].text);
        const [newId] = [cleared[1]];
        assert.notEqual(newId, sessionId);
        assert.deepEqual(
            sessions.sessions().map((s) => [s.sessionId, s.cwd, s.model]),
            [[newId, project.dir, MODEL]],
        );
        assert.equal(
            statusText(sessions.latestUsage(newId)!),
            "ctx 0.0% · 67.0k to compact",
            "the new session's usage from the answer",
        );
        // Nothing but the project's memory files (its next request carries them).
        const usage = await sessions.usage(newId);
        assert.ok(usage.tokens > 0);
        assert.equal(usage.tokens, usage.breakdown.memoryFiles);
    });

    it("Clear does nothing unless confirmed", async () => {
        fake.messageAnswer = undefined;
        await run(Commands.clear);
        assert.equal(fake.messages.length, 1);
        assert.deepEqual(
            sessions.sessions().map((s) => s.sessionId),
            [sessionId],
        );
    });

    it("Show log reveals the output channel; Restart restarts", async () => {
        await run(Commands.showLog);
        assert.equal(fake.outputShown, 1);
        await run(Commands.restart);
        assert.equal(commands.restarts(), 1);
    });
});

describe("commands against scripted answers (a future daemon, an older one)", () => {
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

    const compactResult = (
        preTokens: number,
        postTokens: number,
        problems?: string[],
    ): CompactResult => ({
        boundary: "b",
        trigger: "manual",
        preTokens,
        postTokens,
        summary: "…",
        summarizer: "offline",
        fidelityAppended: 0,
        ...(problems !== undefined ? { problems } : {}),
        usage: usageCase("ok").usage,
    });

    it("Compact now sends the focus and reports the token drop", async () => {
        connection.answer("ctx/compact", () => compactResult(150_000, 20_000));
        fake.inputAnswers.push("  keep the plan ");
        await run(Commands.compact);
        assert.deepEqual(connection.sent.at(-1), {
            method: "ctx/compact",
            params: { sessionId: "s-1", instructions: "keep the plan" },
        });
        assert.deepEqual(fake.messages, [
            { kind: "info", text: "ctxd: compacted 150,000 → 20,000 tokens." },
        ]);
    });

    it("Undo on a Claude Code session gives the token figures when the answer has them", async () => {
        const session = {
            sessionId: "observe-1",
            folder: "/w",
            projectDir: "/c/projects/-w",
            transcript: "/c/projects/-w/t.jsonl",
            claudeSessionId: "t",
            seen: 1,
        };
        connection.answer("ctx/claudeUndo", () => ({
            transcript: session.transcript,
            offset: 10,
            removedBytes: 5,
            preTokens: 12_000,
            postTokens: 110_700,
        }));
        await undoClaude(
            {
                sessions,
                contextView: undefined as never,
                output: undefined as never,
                restart: async () => undefined,
                defaultModel: () => undefined,
            },
            session,
        );
        assert.deepEqual(connection.sent.at(-1), {
            method: "ctx/claudeUndo",
            params: { transcript: session.transcript, sessionId: "t" },
        });
        assert.deepEqual(fake.messages, [
            {
                kind: "info",
                text: "ctxd: the Claude Code session's last compaction is undone: 12,000 → 110,700 tokens; the transcript is as it was before it.",
            },
        ]);
        // An answer without them (today's daemon) says what happened all the same.
        fake.messages = [];
        connection.answer("ctx/claudeUndo", () => ({
            transcript: session.transcript,
            offset: 10,
            removedBytes: 5,
        }));
        await undoClaude(
            {
                sessions,
                contextView: undefined as never,
                output: undefined as never,
                restart: async () => undefined,
                defaultModel: () => undefined,
            },
            session,
        );
        assert.deepEqual(fake.messages, [
            {
                kind: "info",
                text: "ctxd: the Claude Code session's last compaction is undone; the transcript is as it was before it.",
            },
        ]);
    });

    it("Compact now with an empty focus sends no instructions", async () => {
        connection.answer("ctx/compact", () => compactResult(2, 1));
        fake.inputAnswers.push("");
        await run(Commands.compact);
        assert.deepEqual(connection.sent.at(-1), {
            method: "ctx/compact",
            params: { sessionId: "s-1" },
        });
    });

    it("Compact now shows the problems that did not stop the compaction", async () => {
        connection.answer("ctx/compact", () =>
            compactResult(150_000, 20_000, ["PreCompact hook `lint` exited with 1"]),
        );
        fake.inputAnswers.push("");
        await run(Commands.compact);
        assert.deepEqual(fake.messages, [
            { kind: "warning", text: "ctxd: PreCompact hook `lint` exited with 1" },
            { kind: "info", text: "ctxd: compacted 150,000 → 20,000 tokens." },
        ]);
    });

    it("Compact now shows -32601 from a daemon without ctx/compact", async () => {
        fake.inputAnswers.push("");
        await run(Commands.compact);
        assert.equal(
            lastError(),
            "ctxd could not compact the session: this ctxd is too old to do that. Update ctxd.",
        );
    });

    it("Show context falls back to the ctx/usage breakdown and says why (a daemon without ctx/context)", async () => {
        connection.answer("ctx/usage", (p) => ({
            sessionId: (p as { sessionId: string }).sessionId,
            usage: usageCase("warning").usage,
        }));
        await run(Commands.showContext);
        assert.deepEqual(
            connection.sent.slice(-2).map((m) => m.method),
            ["ctx/context", "ctx/usage"],
        );
        assert.deepEqual(fake.messages, []);
        assert.equal(fake.shownDocuments.length, 1);
        const doc = fake.shownDocuments[0];
        const text = doc.getText();
        assert.ok(text.startsWith(`# ctxd context: s-1\n\n> ${OLD_DAEMON_NOTE}\n`), text);
        assert.match(text, /\*\*ctx 50\.1% · 16\.9k to compact\*\*/);
        assert.match(text, /\| Free space \| 16,940 \|/);
        assert.doesNotMatch(text, /## Memory files/);
        // It redraws from the pushed usage, without asking for ctx/context again.
        const sent = connection.sent.length;
        connection.notify("ctx/usageChanged", {
            sessionId: "s-1",
            usage: usageCase("blocked").usage,
        });
        assert.match(doc.getText(), /\*\*ctx 89\.3% · blocked\*\*/);
        assert.ok(doc.getText().includes(`> ${OLD_DAEMON_NOTE}`));
        assert.equal(connection.sent.length, sent);
    });

    it("Show context shows a failing ctx/context as an error", async () => {
        connection.answer("ctx/context", () => {
            throw Object.assign(new Error('unknown session "s-1"'), { code: -33001 });
        });
        await run(Commands.showContext);
        assert.deepEqual(fake.shownDocuments, []);
        assert.deepEqual(fake.messages, [
            {
                kind: "error",
                text: "ctxd could not show the context: ctxd does not know this session (it may have been closed).",
            },
        ]);
    });

    it("Show context lists memory files with their sizes", async () => {
        connection.answer("ctx/context", () => renderCases.contextCase.context);
        await run(Commands.showContext);
        const text = fake.shownDocuments[0].getText();
        assert.match(text, /## Memory files/);
        assert.ok(text.includes("| /home/dev/project/CLAUDE.md | project | 1,428 | loaded |"));
        assert.ok(
            text.includes("| /home/dev/project/.claude/rules/rust.md | rule | 236 | waiting |"),
        );
        assert.doesNotMatch(text, /no ctx\/context yet/);
    });

    it("Show context asks again on ctx/contextChanged of its session; the latest answer wins", async () => {
        const base = renderCases.contextCase.context;
        const answers: ((v: ContextResult) => void)[] = [];
        let calls = 0;
        connection.answer("ctx/context", () => {
            calls += 1;
            if (calls === 1) {
                return base;
            }
            // Later answers wait until the test releases them, in any order.
            return new Promise<ContextResult>((resolve) => answers.push(resolve));
        });
        await run(Commands.showContext);
        const doc = fake.shownDocuments[0];
        connection.notify("ctx/contextChanged", {
            sessionId: "other",
            paths: ["/elsewhere/CLAUDE.md"],
        });
        assert.equal(calls, 1, "another session's change is not this view's");
        connection.notify("ctx/contextChanged", {
            sessionId: "s-1",
            paths: ["/home/dev/project/CLAUDE.md"],
        });
        connection.notify("ctx/contextChanged", {
            sessionId: "s-1",
            paths: ["/home/dev/project/src/lib.rs"],
        });
        await waitFor("two more ctx/context requests", () =>
            answers.length === 2 ? true : undefined,
        );
        const grown = {
            ...base,
            memoryFiles: base.memoryFiles.map((f) =>
                f.kind === "project" ? { ...f, tokens: 2_000 } : f,
            ),
        };
        const stale = {
            ...base,
            memoryFiles: base.memoryFiles.map((f) =>
                f.kind === "project" ? { ...f, tokens: 1_500 } : f,
            ),
        };
        answers[1](grown);
        await waitFor("the newest answer drawn", () =>
            doc.getText().includes("| project | 2,000 | loaded |") ? true : undefined,
        );
        answers[0](stale);
        // The older answer has been handled once what its resolution set off has run.
        await settled();
        assert.ok(
            doc.getText().includes("| project | 2,000 | loaded |"),
            "an older answer does not overwrite a newer one",
        );
    });

    it("Set auto-compact window sends the session's model and says where the window comes from", async () => {
        connection.answer("ctx/setAutoCompactWindow", (p) => ({
            model: (p as { model: string }).model,
            window: 150_000,
            source: "env",
        }));
        fake.inputAnswers.push("200,000");
        await run(Commands.setAutoCompactWindow);
        assert.deepEqual(connection.sent.at(-1), {
            method: "ctx/setAutoCompactWindow",
            params: { model: MODEL, window: 200_000 },
        });
        assert.deepEqual(fake.messages, [
            {
                kind: "info",
                text: `ctxd: auto-compact window for ${MODEL} is 150,000 tokens (CLAUDE_CODE_AUTO_COMPACT_WINDOW overrides saved windows).`,
            },
        ]);
    });

    it("Set auto-compact window shows every warning of the answer", async () => {
        const [, withWarnings] = renderCases.windowCases;
        connection.answer("ctx/setAutoCompactWindow", () => withWarnings.result);
        fake.inputAnswers.push("2m");
        await run(Commands.setAutoCompactWindow);
        assert.deepEqual(connection.sent.at(-1)?.params, { model: MODEL, window: 2_000_000 });
        assert.deepEqual(fake.messages, [
            ...(withWarnings.result.warnings ?? []).map((w) => ({
                kind: "warning",
                text: `ctxd: ${w}`,
            })),
            { kind: "info", text: windowResultText(withWarnings.result) },
        ]);
        assert.ok((withWarnings.result.warnings ?? []).length > 0);
    });

    it("Set auto-compact window shows -32601 from a daemon without it", async () => {
        fake.inputAnswers.push("auto");
        await run(Commands.setAutoCompactWindow);
        assert.deepEqual(connection.sent.at(-1), {
            method: "ctx/setAutoCompactWindow",
            params: { model: MODEL, window: "auto" },
        });
        assert.equal(
            lastError(),
            "ctxd could not save the auto-compact window: this ctxd is too old to do that. Update ctxd.",
        );
    });

    it("Clear moves the session to the new id, with the new session's usage", async () => {
        connection.answer("ctx/clear", () => ({ sessionId: "s-2", usage: usageCase("ok").usage }));
        fake.messageAnswer = "Clear";
        await run(Commands.clear);
        assert.deepEqual(
            sessions.sessions().map((s) => s.sessionId),
            ["s-2"],
        );
        assert.deepEqual(sessions.latestUsage("s-2"), usageCase("ok").usage);
        assert.deepEqual(fake.messages.at(-1), {
            kind: "info",
            text: "ctxd: cleared; the new session is s-2.",
        });
    });

    it("Clear shows -32601 from a daemon without it and keeps the session", async () => {
        fake.messageAnswer = "Clear";
        await run(Commands.clear);
        assert.equal(
            lastError(),
            "ctxd could not clear the session: this ctxd is too old to do that. Update ctxd.",
        );
        assert.deepEqual(
            sessions.sessions().map((s) => s.sessionId),
            ["s-1"],
        );
    });

    it("asks which session when several are open", async () => {
        await sessions.openSession({ cwd: "/w", model: MODEL, sessionId: "s-9" });
        connection.answer("ctx/context", () => renderCases.contextCase.context);
        fake.quickPick = (items) => items[1];
        await run(Commands.showContext);
        assert.deepEqual(connection.sent.at(-1), {
            method: "ctx/context",
            params: { sessionId: "s-9" },
        });
    });

    it("reports ctx/compacted and ctx/compactFailed", () => {
        const reporting = reportCompactions(sessions);
        connection.notify("ctx/compacted", {
            sessionId: "s-1",
            trigger: "auto",
            preTokens: 170_000,
            postTokens: 30_000,
        });
        connection.notify("ctx/compactFailed", {
            sessionId: "s-1",
            reason: "Autocompact is thrashing",
        });
        assert.deepEqual(fake.messages, [
            { kind: "info", text: "ctxd: compacted (auto) 170,000 → 30,000 tokens." },
            { kind: "warning", text: "ctxd: compaction failed: Autocompact is thrashing" },
        ]);
        reporting.forEach((d) => d.dispose());
    });

    it("does not report a manual compaction twice (Compact now reports it)", async () => {
        const reporting = reportCompactions(sessions);
        connection.answer("ctx/compact", (p) => {
            connection.notify("ctx/compacted", {
                sessionId: (p as { sessionId: string }).sessionId,
                trigger: "manual",
                preTokens: 9_000,
                postTokens: 900,
            });
            return compactResult(9_000, 900);
        });
        fake.inputAnswers.push("");
        await run(Commands.compact);
        assert.deepEqual(fake.messages, [
            { kind: "info", text: "ctxd: compacted 9,000 → 900 tokens." },
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

    it("reads the inputs the Neovim client reads, the same way", () => {
        for (const [input, expected] of renderCases.windowInputs) {
            assert.equal(parseWindow(input), expected ?? undefined, JSON.stringify(input));
        }
    });
});
