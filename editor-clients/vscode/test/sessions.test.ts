/**
 * The sessions API against the real daemon: open, append, `ctx/usageChanged`, saved
 * windows, file reads and `ctx/contextChanged`, the methods the daemon does not have
 * yet, and resuming sessions after a crash.
 */
import * as assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";

import { describeError, errorCode, isMethodNotFound } from "../src/errors";
import * as ext from "../src/lsp_ext";
import {
    type ContextChangedNotification,
    ErrorCodes,
    type Usage,
    type UsageChangedNotification,
} from "../src/lsp_ext";
import { statusText } from "../src/render";
import { CtxdSessions } from "../src/sessions";
import {
    startDaemon,
    TEST_SETTINGS,
    tempStateDir,
    type TestDaemon,
    EMPTY_CWD,
} from "./support/daemon";
import { makeProject, writeAtomically } from "./support/project";
import { assistantRecord, userRecord } from "./support/records";
import { waitFor } from "./support/wait";

const MODEL = "claude-sonnet-4-5-20250929";

describe("CtxdSessions on a real ctxd", () => {
    let daemon: TestDaemon;
    let sessions: CtxdSessions;
    let changes: UsageChangedNotification[];

    beforeEach(async () => {
        daemon = await startDaemon(tempStateDir(), { settings: TEST_SETTINGS });
        sessions = new CtxdSessions();
        sessions.attach(daemon.connection);
        changes = [];
        sessions.onUsageChanged((c) => changes.push(c));
    });
    afterEach(async () => {
        sessions.dispose();
        await daemon.stop();
    });

    it("starts a session's usage from the open answer", async () => {
        const opened = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        assert.equal(opened.resumed, false);
        assert.equal(opened.usage.window, 100_000);
        // The daemon's push of the opened state may arrive before the answer or be
        // folded into it; either way the last change is the opened usage.
        assert.ok(changes.length >= 1 && changes.length <= 2, JSON.stringify(changes));
        assert.deepEqual(changes[changes.length - 1], {
            sessionId: opened.sessionId,
            usage: opened.usage,
        });
        assert.equal(statusText(opened.usage), "ctx 0.0% · 67.0k to compact");
        assert.deepEqual(
            sessions.sessions().map((s) => s.sessionId),
            [opened.sessionId],
        );
    });

    it("renders the usage ctx/usageChanged brings after an append", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const user = userRecord("hello");
        const appended = await sessions.append(sessionId, [
            user,
            assistantRecord(50_060, user.uuid as string),
        ]);
        assert.equal(appended.appended, 2);
        const change = await waitFor("a usage at 50,060 tokens", () =>
            changes.find((c) => c.usage.tokens === 50_060),
        );
        assert.equal(change.sessionId, sessionId);
        assert.equal(change.usage.level, "warning");
        assert.equal(statusText(change.usage), "ctx 50.1% · 16.9k to compact");
        assert.deepEqual(sessions.latestUsage(sessionId), change.usage);
        assert.deepEqual(await sessions.usage(sessionId), change.usage);
    });

    it("ends a burst of appends on the daemon's final usage (coalesced)", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        let parent: string | null = null;
        const appends: Promise<unknown>[] = [];
        for (let i = 0; i < 30; i++) {
            const record = userRecord(`message ${i} `.repeat(20), parent);
            parent = record.uuid as string;
            appends.push(sessions.append(sessionId, [record]));
        }
        await Promise.all(appends);
        const final: Usage = await sessions.usage(sessionId);
        await waitFor("the final usage", () =>
            changes.at(-1)?.usage.tokens === final.tokens ? true : undefined,
        );
        assert.ok(changes.length < 30, `coalesced into ${changes.length} notifications`);
    });

    it("reports the methods the daemon does not have yet as a readable error", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const calls: [string, () => Promise<unknown>][] = [
            [
                "ctx/assemble",
                () => sessions.assemble({ sessionId, system: [], tools: [], maxTokens: 1000 }),
            ],
            ["ctx/noSuchMethod", () => sessions.request("ctx/noSuchMethod", { sessionId })],
        ];
        const missing = calls.filter(([method]) => !daemon.capabilities.methods.includes(method));
        assert.ok(missing.some(([method]) => method === "ctx/noSuchMethod"));
        for (const [method, call] of missing) {
            const error = await call().then(
                () => undefined,
                (e: unknown) => e,
            );
            assert.ok(isMethodNotFound(error), `${method}: ${String(error)}`);
            assert.match(
                describeError(method, error),
                /: this ctxd is too old to do that\. Update ctxd\.$/,
            );
        }
        // The session is still there and answering.
        assert.equal((await sessions.usage(sessionId)).tokens, 0);
    });

    it("clears a session into a new one, and compacts one on a provider's refusal", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const user = userRecord("hello");
        await sessions.append(sessionId, [user, assistantRecord(50_060, user.uuid as string)]);
        const none = await sessions.reportProviderError(sessionId, {
            status: 529,
            type: "overloaded_error",
            message: "Overloaded",
        });
        assert.equal(none.action, "none");
        assert.equal(none.compact, undefined);
        const refused = await sessions.reportProviderError(sessionId, {
            status: 400,
            type: "invalid_request_error",
            message: "prompt is too long: 210000 tokens > 200000 maximum",
        });
        assert.equal(refused.action, "compacted", refused.reason);
        assert.equal(refused.compact?.trigger, "reactive");
        assert.ok((refused.compact?.postTokens ?? Infinity) < 50_060);
        const newId = await sessions.clear(sessionId);
        assert.notEqual(newId, sessionId);
        assert.deepEqual(
            sessions.sessions().map((s) => s.sessionId),
            [newId],
        );
        assert.equal(sessions.latestUsage(newId)?.tokens, 0);
    });

    it("saves an auto-compact window; the model's open sessions follow at once", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const other = await sessions.openSession({
            cwd: EMPTY_CWD,
            model: "claude-opus-4-1-20250805",
        });
        const result = await sessions.setAutoCompactWindow(MODEL, 200_000);
        assert.deepEqual(result, {
            model: MODEL,
            window: 200_000,
            source: "setting",
            requested: 200_000,
            modelWindow: 200_000,
        });
        const change = await waitFor("ctx/usageChanged with the new window", () =>
            changes.find((c) => c.sessionId === sessionId && c.usage.window === 200_000),
        );
        assert.equal(statusText(change.usage), "ctx 0.0% · 167.0k to compact");
        assert.equal(
            sessions.latestUsage(other.sessionId)?.window,
            100_000,
            "another model's session keeps its window",
        );
        const clamped = await sessions.setAutoCompactWindow(MODEL, 50_000);
        assert.equal(clamped.window, 100_000);
        assert.deepEqual(clamped.warnings, [
            "autoCompactWindow setting 50000 is outside 100000..=1000000; using 100000",
        ]);
        const error = await sessions.setAutoCompactWindow(MODEL, "huge" as never).then(
            () => undefined,
            (e: unknown) => e,
        );
        assert.equal(errorCode(error), ErrorCodes.InvalidParams);
        assert.match(
            describeError("ctx/setAutoCompactWindow", error),
            /^ctxd could not save the auto-compact window: window: /,
        );
    });

    it("records a file read and says when the agent already had the text", async () => {
        const project = makeProject();
        const { sessionId } = await sessions.openSession({ cwd: project.dir, model: MODEL });
        const contextChanges: ContextChangedNotification[] = [];
        sessions.onContextChanged((c) => contextChanges.push(c));
        const first = await sessions.fileRead({ sessionId, path: project.notes });
        assert.deepEqual(
            { ...first, tokens: undefined },
            {
                path: project.notes,
                alreadyRead: false,
                unchanged: false,
                reads: 1,
                startLine: 1,
                numLines: 3,
                totalLines: 3,
                tokens: undefined,
            },
        );
        assert.ok(first.tokens > 0);
        const again = await sessions.fileRead({ sessionId, path: project.notes });
        assert.deepEqual([again.alreadyRead, again.unchanged, again.reads], [true, true, 2]);
        await assert.rejects(
            sessions.fileRead({ sessionId, path: "notes.txt" }),
            (e: unknown) => errorCode(e) === ErrorCodes.InvalidParams,
        );
        // The file changes on disk: ctx/contextChanged, and ctx/context lists it as stale.
        writeAtomically(project.notes, "changed\n");
        const change = await waitFor("ctx/contextChanged", () =>
            contextChanges.find((c) => c.paths.includes(project.notes)),
        );
        assert.equal(change.sessionId, sessionId);
        const context = await sessions.context(sessionId);
        assert.deepEqual(context.staleFiles, [project.notes]);
        assert.equal(context.filesRead, 1);
    });

    it("assembles the next model request from the session", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const user = userRecord("hello");
        await sessions.append(sessionId, [
            user,
            assistantRecord(20_000, user.uuid as string),
            userRecord("next", user.uuid as string),
        ]);
        const assembled = await sessions.assemble({
            sessionId,
            system: [{ type: "text", text: "You are a test." }],
            tools: [],
            maxTokens: 1000,
        });
        assert.equal(assembled.request.model, MODEL);
        assert.equal(assembled.request.max_tokens, 1000);
        assert.ok(
            Array.isArray(assembled.request.messages) && assembled.request.messages.length > 0,
        );
        assert.ok(assembled.requestTokens > 0);
        assert.equal(assembled.decision, "continue");
        assert.ok(
            assembled.applied.every(
                (a) => typeof a.stage === "string" && typeof a.acted === "boolean",
            ),
        );
        assert.deepEqual(assembled.usage, await sessions.usage(sessionId));
    });

    it("hands out the next request whole while the daemon sends only what changed", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const params = {
            sessionId,
            system: [{ type: "text", text: "You are a test." }],
            tools: [],
            maxTokens: 1000,
        };
        const sent: ext.AssembleParams[] = [];
        const answers: ext.AssembleResult[] = [];
        const connection = daemon.connection;
        sessions.attach({
            ...connection,
            onNotification: (method, handler) => connection.onNotification(method, handler),
            request: async <R>(method: string, p: unknown): Promise<R> => {
                const result = await connection.request<R>(method, p);
                if (method === ext.assemble.method) {
                    sent.push(p as ext.AssembleParams);
                    answers.push(result as ext.AssembleResult);
                }
                return result;
            },
        });
        let parent: string | null = null;
        let next: ext.AssembleResult | undefined;
        for (let turn = 0; turn < 6; turn++) {
            const user = userRecord(`question ${turn}`, parent);
            const reply = assistantRecord(20_000 + turn * 100, user.uuid as string);
            parent = reply.uuid as string;
            await sessions.append(sessionId, [user, reply]);
            next = await sessions.nextRequest(params);
            assert.equal(next.messagesFrom, 0);
            assert.equal((next.request.messages as unknown[]).length, 2 * turn + 2, `turn ${turn}`);
        }
        // After the first, each asked since the previous answer and was sent a few messages.
        assert.equal(sent[0].since, undefined);
        for (let i = 1; i < answers.length; i++) {
            assert.equal(sent[i].since, answers[i - 1].revision);
            assert.ok(answers[i].messagesFrom > 0, JSON.stringify(answers[i].messagesFrom));
            assert.ok((answers[i].request.messages as unknown[]).length <= 3);
        }
        // The spliced request is the one the daemon assembles whole.
        const whole = await sessions.assemble(params);
        assert.equal(whole.messagesFrom, 0);
        assert.deepEqual(next?.request, whole.request);
    });

    it("passes any ctx/ method through request()", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const result = await sessions.request<{ sessionId: string; usage: Usage }>("ctx/usage", {
            sessionId,
        });
        assert.equal(result.sessionId, sessionId);
    });

    it("forgets a closed session", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        await sessions.closeSession(sessionId);
        assert.deepEqual(sessions.sessions(), []);
        // The daemon still has it in its store and resumes it on first use.
        const again = await sessions.usage(sessionId);
        assert.equal(again.tokens, 0);
        await assert.rejects(
            sessions.usage("never-opened"),
            (e: unknown) =>
                describeError("ctx/usage", e) ===
                "ctxd could not read the session's usage: ctxd does not know this session (it may have been closed).",
        );
    });

    it("resumes its sessions on a restarted daemon, and usage flows again", async () => {
        const { sessionId } = await sessions.openSession({ cwd: EMPTY_CWD, model: MODEL });
        const first = userRecord("before the crash");
        await sessions.append(sessionId, [first, assistantRecord(20_000, first.uuid as string)]);
        await waitFor("usage before the crash", () =>
            changes.find((c) => c.usage.tokens === 20_000),
        );

        await daemon.kill();
        daemon = await startDaemon(daemon.stateDir, { settings: TEST_SETTINGS });
        sessions.attach(daemon.connection);
        await sessions.reopenAll();
        assert.equal(sessions.latestUsage(sessionId)?.tokens, 20_000, "resumed from the store");

        const second = userRecord("after the restart", first.uuid as string);
        await sessions.append(sessionId, [second, assistantRecord(40_000, second.uuid as string)]);
        const change = await waitFor("usage after the restart", () =>
            changes.find((c) => c.usage.tokens === 40_000),
        );
        assert.equal(change.sessionId, sessionId);
        assert.equal(statusText(change.usage), "ctx 40.0% · 27.0k to compact");
    });
});

describe("two windows on one store", () => {
    it("share the first window's daemon: the second sees the first's session and appends, and the first sees the second's", async () => {
        const stateDir = tempStateDir();
        const first = await startDaemon(stateDir, { settings: TEST_SETTINGS });
        // The second `ctxd serve` relays to the first; it names its own process.
        const second = await startDaemon(stateDir, { settings: TEST_SETTINGS });
        try {
            assert.equal(second.capabilities.processId, second.process.pid);
            assert.equal(first.capabilities.processId, first.process.pid);
            const [a, b] = [new CtxdSessions(), new CtxdSessions()];
            a.attach(first.connection);
            b.attach(second.connection);
            const opened = await a.openSession({ cwd: EMPTY_CWD, model: MODEL });
            const seen: UsageChangedNotification[] = [];
            a.onUsageChanged((c) => seen.push(c));
            // Open in the daemon already: the same session, not a new one.
            const again = await b.openSession({
                cwd: EMPTY_CWD,
                model: MODEL,
                sessionId: opened.sessionId,
            });
            assert.equal(again.sessionId, opened.sessionId);
            const user = userRecord("from the second window");
            await b.append(opened.sessionId, [user, assistantRecord(40_000, user.uuid as string)]);
            const change = await waitFor("the first window's usage", () =>
                seen.find((c) => c.usage.tokens >= 40_000),
            );
            assert.equal(change.sessionId, opened.sessionId);
            a.dispose();
            b.dispose();
        } finally {
            await second.stop();
            await first.stop();
        }
    });
});
