/**
 * Where Claude Code keeps a folder's transcripts, the id ctxd publishes a transcript
 * under, and the model read from a transcript's tail.
 */
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";

import { claudeConfigDir, claudeProjectDir, isObservedId, ObservedSessions, observeId, transcriptModel } from "../src/claude";
import { usageCase } from "./support/fixtures";

describe("Claude Code's project folders", () => {
    it("is $CLAUDE_CONFIG_DIR, else ~/.claude", () => {
        assert.equal(claudeConfigDir({ CLAUDE_CONFIG_DIR: "/etc/claude" }, "/home/u"), "/etc/claude");
        assert.equal(claudeConfigDir({ CLAUDE_CONFIG_DIR: "" }, "/home/u"), "/home/u/.claude");
        assert.equal(claudeConfigDir({}, "/home/u"), "/home/u/.claude");
    });

    it("names a folder's project with every character but ASCII letters and digits as -", () => {
        assert.equal(claudeProjectDir("/home/u/my.app_1", "/c"), "/c/projects/-home-u-my-app-1");
        assert.equal(claudeProjectDir("/srv/a b/Ünï", "/c"), "/c/projects/-srv-a-b--n-");
    });
});

describe("observeId", () => {
    it("is FNV-1a (64-bit) of the path, as the daemon computes it", () => {
        assert.equal(observeId(""), "observe-cbf29ce484222325");
        assert.equal(observeId("a"), "observe-af63dc4c8601ec8c");
        assert.ok(isObservedId(observeId("/x.jsonl")));
        assert.ok(!isObservedId("3f1c…"));
    });
});

describe("transcriptModel", () => {
    it("reads the latest real model from the tail, skipping synthetic ones and cut lines", () => {
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-claude-"));
        const file = path.join(dir, "t.jsonl");
        const assistant = (model: string) => JSON.stringify({ type: "assistant", message: { role: "assistant", model, content: [] } });
        fs.writeFileSync(file, [assistant("claude-opus-4-1"), assistant("claude-sonnet-4-5-20250929"), assistant("<synthetic>"), '{"type":"assistant","mess'].join("\n"));
        assert.equal(transcriptModel(file), "claude-sonnet-4-5-20250929");
        assert.equal(transcriptModel(path.join(dir, "missing.jsonl")), undefined);
    });
});

describe("ObservedSessions", () => {
    /** A workspace folder and its Claude Code project under a fresh config dir. */
    function project(): { configDir: string; folder: string; projectDir: string } {
        const configDir = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-observed-"));
        const folder = path.join(configDir, "app");
        return { configDir, folder, projectDir: claudeProjectDir(folder, configDir) };
    }

    function connection(answer: (projectDir: string) => Promise<unknown>): { asked: string[]; request<R>(method: string, params: unknown): Promise<R>; onUsageChanged(): { dispose(): void } } {
        const asked: string[] = [];
        return {
            asked,
            request: <R>(method: string, params: unknown) => {
                assert.equal(method, "ctx/observe");
                const { projectDir } = params as { projectDir: string };
                asked.push(projectDir);
                return answer(projectDir) as Promise<R>;
            },
            onUsageChanged: () => ({ dispose: () => undefined }),
        };
    }

    it("asks at most twice while the daemon is down and a transcript exists, then waits for the next start", async () => {
        const { configDir, folder, projectDir } = project();
        fs.mkdirSync(projectDir, { recursive: true });
        const transcript = path.join(projectDir, "s.jsonl");
        fs.writeFileSync(transcript, "");
        const down = connection(() => Promise.reject(new Error("Client is not running")));
        const logged: string[] = [];
        const observed = new ObservedSessions(down, () => configDir, (line) => logged.push(line));
        await observed.observe([folder]);
        // The client gives up until the next daemon start, and says so.
        const gaveUp = `[ctxd client] cannot observe the Claude Code sessions of ${folder}: Client is not running`;
        assert.ok(logged.includes(gaveUp), JSON.stringify(logged));
        assert.equal(down.asked.length, 2);
        // Nor does it ask again over the next 200 ms, while the transcript grows (a watcher
        // on the project would fire).
        fs.appendFileSync(transcript, "{}\n");
        await new Promise((resolve) => setTimeout(resolve, 200));
        assert.equal(down.asked.length, 2);
        assert.deepEqual(observed.unobserved(), [{ folder, projectDir, reason: "Client is not running" }]);
        observed.dispose();
    });

    it("watches a project with no transcript, and observes it once one appears", async () => {
        const { configDir, folder, projectDir } = project();
        const transcript = path.join(projectDir, "s.jsonl");
        const usage = usageCase("ok").usage;
        const daemon = connection(() => (fs.existsSync(transcript) ? Promise.resolve({ sessionId: observeId(transcript), usage }) : Promise.reject(new Error("no transcript yet"))));
        const observed = new ObservedSessions(daemon, () => configDir);
        await observed.observe([folder]);
        assert.equal(observed.unobserved()[0]?.reason, "no transcript yet");
        fs.mkdirSync(projectDir, { recursive: true });
        fs.writeFileSync(transcript, "");
        for (let i = 0; i < 200 && observed.newest() === undefined; i++) {
            await new Promise((resolve) => setTimeout(resolve, 10));
        }
        assert.equal(observed.newest()?.transcript, transcript);
        assert.deepEqual(observed.unobserved(), []);
        observed.dispose();
    });
});
