/**
 * The sessions API against the real daemon: open, append, `ctx/usageChanged`, the
 * methods the daemon does not have yet, and resuming sessions after a crash.
 */
import * as assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";

import { describeError, isMethodNotFound } from "../src/errors";
import type { Usage, UsageChangedParams } from "../src/lsp_ext";
import { statusText } from "../src/render";
import { CtxdSessions } from "../src/sessions";
import { startDaemon, tempStateDir, type TestDaemon } from "./support/daemon";
import { assistantRecord, userRecord } from "./support/records";
import { waitFor } from "./support/wait";

const MODEL = "claude-sonnet-4-5-20250929";

describe("CtxdSessions on a real ctxd", () => {
    let daemon: TestDaemon;
    let sessions: CtxdSessions;
    let changes: UsageChangedParams[];

    beforeEach(async () => {
        daemon = await startDaemon(tempStateDir(), { settings: { autoCompactWindow: 100_000 } });
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
        const opened = await sessions.openSession({ cwd: process.cwd(), model: MODEL });
        assert.equal(opened.resumed, false);
        assert.equal(opened.usage.window, 100_000);
        // The daemon's push of the opened state may arrive before the answer or be
        // folded into it; either way the last change is the opened usage.
        assert.ok(changes.length >= 1 && changes.length <= 2, JSON.stringify(changes));
        assert.deepEqual(changes[changes.length - 1], { sessionId: opened.sessionId, usage: opened.usage });
        assert.equal(statusText(opened.usage), "ctx 0.0% · 67.0k to compact");
        assert.deepEqual(sessions.sessions().map((s) => s.sessionId), [opened.sessionId]);
    });

    it("renders the usage ctx/usageChanged brings after an append", async () => {
        const { sessionId } = await sessions.openSession({ cwd: process.cwd(), model: MODEL });
        const user = userRecord("hello");
        const appended = await sessions.append(sessionId, [user, assistantRecord(50_060, user.uuid as string)]);
        assert.equal(appended.appended, 2);
        const change = await waitFor("a usage at 50,060 tokens", () => changes.find((c) => c.usage.tokens === 50_060));
        assert.equal(change.sessionId, sessionId);
        assert.equal(change.usage.level, "warning");
        assert.equal(statusText(change.usage), "ctx 62.6% · 16.9k to compact");
        assert.deepEqual(sessions.latestUsage(sessionId), change.usage);
        assert.deepEqual(await sessions.usage(sessionId), change.usage);
    });

    it("ends a burst of appends on the daemon's final usage (coalesced)", async () => {
        const { sessionId } = await sessions.openSession({ cwd: process.cwd(), model: MODEL });
        let parent: string | null = null;
        const appends: Promise<unknown>[] = [];
        for (let i = 0; i < 30; i++) {
            const record = userRecord(`message ${i} `.repeat(20), parent);
            parent = record.uuid as string;
            appends.push(sessions.append(sessionId, [record]));
        }
        await Promise.all(appends);
        const final: Usage = await sessions.usage(sessionId);
        await waitFor("the final usage", () => (changes.at(-1)?.usage.tokens === final.tokens ? true : undefined));
        assert.ok(changes.length < 30, `coalesced into ${changes.length} notifications`);
    });

    it("reports the methods the daemon does not have yet as a readable error", async () => {
        const { sessionId } = await sessions.openSession({ cwd: process.cwd(), model: MODEL });
        const calls: [string, () => Promise<unknown>][] = [
            ["ctx/compact", () => sessions.compact(sessionId, "keep the plan")],
            ["ctx/context", () => sessions.context(sessionId)],
            ["ctx/setAutoCompactWindow", () => sessions.setAutoCompactWindow(MODEL, 200_000)],
            ["ctx/clear", () => sessions.clear(sessionId)],
        ];
        for (const [method, call] of calls) {
            const error = await call().then(
                () => undefined,
                (e: unknown) => e,
            );
            if (error === undefined) {
                continue; // The daemon has it now.
            }
            assert.ok(isMethodNotFound(error), `${method}: ${String(error)}`);
            assert.match(describeError(method, error), new RegExp(`^ctxd does not support ${method} yet \\(error -32601: `));
        }
        // The session is still there and answering.
        assert.equal((await sessions.usage(sessionId)).tokens, 0);
    });

    it("passes any ctx/ method through request()", async () => {
        const { sessionId } = await sessions.openSession({ cwd: process.cwd(), model: MODEL });
        const result = await sessions.request<{ sessionId: string; usage: Usage }>("ctx/usage", { sessionId });
        assert.equal(result.sessionId, sessionId);
    });

    it("forgets a closed session", async () => {
        const { sessionId } = await sessions.openSession({ cwd: process.cwd(), model: MODEL });
        await sessions.closeSession(sessionId);
        assert.deepEqual(sessions.sessions(), []);
        // The daemon still has it in its store and resumes it on first use.
        const again = await sessions.usage(sessionId);
        assert.equal(again.tokens, 0);
        await assert.rejects(sessions.usage("never-opened"), (e: unknown) => /not open/.test(describeError("ctx/usage", e)));
    });

    it("resumes its sessions on a restarted daemon, and usage flows again", async () => {
        const { sessionId } = await sessions.openSession({ cwd: process.cwd(), model: MODEL });
        const first = userRecord("before the crash");
        await sessions.append(sessionId, [first, assistantRecord(20_000, first.uuid as string)]);
        await waitFor("usage before the crash", () => changes.find((c) => c.usage.tokens === 20_000));

        await daemon.kill();
        daemon = await startDaemon(daemon.stateDir, { settings: { autoCompactWindow: 100_000 } });
        sessions.attach(daemon.connection);
        await sessions.reopenAll();
        assert.equal(sessions.latestUsage(sessionId)?.tokens, 20_000, "resumed from the store");

        const second = userRecord("after the restart", first.uuid as string);
        await sessions.append(sessionId, [second, assistantRecord(40_000, second.uuid as string)]);
        const change = await waitFor("usage after the restart", () => changes.find((c) => c.usage.tokens === 40_000));
        assert.equal(change.sessionId, sessionId);
        assert.equal(statusText(change.usage), "ctx 50.0% · 27.0k to compact");
    });
});
