/**
 * Where Claude Code keeps a folder's transcripts, the id ctxd publishes a transcript
 * under, and the model read from a transcript's tail.
 */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";

import {
    claudeConfigDir,
    claudeProjectDir,
    claudeProjectFolderName,
    isObservedId,
    ObservedSessions,
    observeId,
    transcriptModel,
} from "../src/claude";
import { observedText } from "../src/daemonStatus";
import { packageRoot } from "./support/daemon";
import { renderCases, usageCase } from "./support/fixtures";

/** What the real Claude Code program named each folder (editor-clients/scripts/claude-project-folders). */
const folderCases: {
    cases: { cwd: string; folder: string }[];
    symlink: { link: string; target: string; folder: string };
} = JSON.parse(
    fs.readFileSync(path.join(packageRoot, "../fixtures/claude-project-folders.json"), "utf8"),
);

describe("Claude Code's project folders", () => {
    it("is $CLAUDE_CONFIG_DIR, else ~/.claude", () => {
        assert.equal(
            claudeConfigDir({ CLAUDE_CONFIG_DIR: "/etc/claude" }, "/home/u"),
            "/etc/claude",
        );
        assert.equal(claudeConfigDir({ CLAUDE_CONFIG_DIR: "" }, "/home/u"), "/home/u/.claude");
        assert.equal(claudeConfigDir({}, "/home/u"), "/home/u/.claude");
    });

    it("names a folder's project as the real program did, in every pinned case", () => {
        assert.ok(folderCases.cases.length >= 9);
        for (const { cwd, folder } of folderCases.cases) {
            assert.equal(claudeProjectFolderName(cwd), folder, cwd);
        }
        // A character outside the Basic Multilingual Plane is two UTF-16 units: two dashes.
        assert.equal(claudeProjectFolderName("/w/café-😀"), "-w-caf----");
        assert.equal(claudeProjectDir("/home/u/my.app_1", "/c"), "/c/projects/-home-u-my-app-1");
    });

    it("names the project after the real path of a folder opened through a symlink, as the program does", () => {
        assert.equal(
            folderCases.symlink.folder,
            claudeProjectFolderName(folderCases.symlink.target),
            "the pinned case",
        );
        const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-link-")));
        const target = path.join(dir, "café-😀");
        fs.mkdirSync(target);
        fs.symlinkSync(target, path.join(dir, "link"));
        assert.equal(
            claudeProjectDir(path.join(dir, "link"), "/c"),
            path.join("/c/projects", claudeProjectFolderName(target)),
        );
        // A folder that does not exist is named as given.
        assert.equal(
            claudeProjectDir(path.join(dir, "gone"), "/c"),
            path.join("/c/projects", claudeProjectFolderName(path.join(dir, "gone"))),
        );
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
        const assistant = (model: string) =>
            JSON.stringify({
                type: "assistant",
                message: { role: "assistant", model, content: [] },
            });
        fs.writeFileSync(
            file,
            [
                assistant("claude-opus-4-1"),
                assistant("claude-sonnet-4-5-20250929"),
                assistant("<synthetic>"),
                '{"type":"assistant","mess',
            ].join("\n"),
        );
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

    function connection(answer: (projectDir: string) => Promise<unknown>): {
        asked: string[];
        request<R>(method: string, params: unknown): Promise<R>;
        onUsageChanged(): { dispose(): void };
    } {
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
        const observed = new ObservedSessions(
            down,
            () => configDir,
            (line) => logged.push(line),
        );
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
        assert.deepEqual(observed.unobserved(), [
            { folder, projectDir, reason: "Client is not running" },
        ]);
        observed.dispose();
    });

    it("watches a project with no transcript, and observes it once one appears", async () => {
        const { configDir, folder, projectDir } = project();
        const transcript = path.join(projectDir, "s.jsonl");
        const usage = usageCase("ok").usage;
        const daemon = connection(() =>
            fs.existsSync(transcript)
                ? Promise.resolve({ sessionId: observeId(transcript), usage })
                : Promise.reject(new Error("no transcript yet")),
        );
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

    /** A daemon stand-in that answers ctx/observe and pushes usage when told. */
    function daemon(): {
        asked: unknown[];
        push(
            sessionId: string,
            level: "ok" | "warning",
            cache?: (typeof renderCases.cacheCases)[number]["cache"],
        ): void;
        request<R>(method: string, params: unknown): Promise<R>;
        onUsageChanged(
            listener: (p: {
                sessionId: string;
                usage: ReturnType<typeof usageCase>["usage"];
            }) => void,
        ): { dispose(): void };
    } {
        const listeners: ((p: {
            sessionId: string;
            usage: ReturnType<typeof usageCase>["usage"];
        }) => void)[] = [];
        const asked: unknown[] = [];
        return {
            asked,
            push: (sessionId, level, cache) =>
                listeners.forEach((l) =>
                    l({ sessionId, usage: { ...usageCase(level).usage, cache } }),
                ),
            request: <R>(_method: string, params: unknown) => {
                asked.push(params);
                const { projectDir, transcript } = params as {
                    projectDir?: string;
                    transcript?: string;
                };
                const newest =
                    transcript ??
                    path.join(
                        projectDir ?? "",
                        fs
                            .readdirSync(projectDir ?? "")
                            .sort()
                            .at(-1) ?? "",
                    );
                return Promise.resolve({
                    sessionId: observeId(newest),
                    usage: usageCase("ok").usage,
                } as R);
            },
            onUsageChanged: (listener) => {
                listeners.push(listener);
                return { dispose: () => undefined };
            },
        };
    }

    it("shows the session that changed last, or the one pinned; lists every transcript on disk", async () => {
        const { configDir, folder, projectDir } = project();
        fs.mkdirSync(projectDir, { recursive: true });
        const older = path.join(projectDir, "a-older.jsonl");
        const newer = path.join(projectDir, "b-newer.jsonl");
        fs.writeFileSync(older, "");
        fs.utimesSync(older, new Date(1_000_000), new Date(1_000_000));
        fs.writeFileSync(newer, "");
        const d = daemon();
        const observed = new ObservedSessions(d, () => configDir);
        await observed.observe([folder]);
        assert.equal(observed.shown()?.transcript, newer);
        // The older session is listed though the daemon sent nothing for it.
        const listed = observed.listed();
        assert.deepEqual(
            listed.map((l) => [l.claudeSessionId, l.session?.sessionId]),
            [
                ["b-newer", observeId(newer)],
                ["a-older", undefined],
            ],
        );
        // Picking it follows it (one ctx/observe of that transcript) and pins it.
        const followed = await observed.follow(listed[1]);
        assert.deepEqual(d.asked.at(-1), { transcript: older });
        observed.pin(followed.sessionId);
        d.push(observeId(newer), "warning");
        assert.equal(
            observed.shown()?.transcript,
            older,
            "pinned: the newer one's change does not take the item",
        );
        assert.equal(observed.newest()?.transcript, newer);
        // Following a session already followed asks nothing.
        const before = d.asked.length;
        await observed.follow(observed.listed()[0]);
        assert.equal(d.asked.length, before);
        observed.pin(undefined);
        assert.equal(observed.shown()?.transcript, newer, "unpinned: the one that changed last");
        observed.dispose();
    });

    it("forgets a folder's sessions, reasons and pin, and ignores their usage after", async () => {
        const { configDir, folder, projectDir } = project();
        fs.mkdirSync(projectDir, { recursive: true });
        const transcript = path.join(projectDir, "s.jsonl");
        fs.writeFileSync(transcript, "");
        const d = daemon();
        const observed = new ObservedSessions(d, () => configDir);
        await observed.observe([folder]);
        observed.pin(observeId(transcript));
        observed.forget();
        assert.equal(observed.shown(), undefined);
        assert.equal(observed.pinned(), undefined);
        assert.deepEqual(observed.listed(), []);
        d.push(observeId(transcript), "warning");
        assert.equal(observed.shown(), undefined, "a forgotten folder's usage is not shown");
        observed.dispose();
    });

    it("shows the cold cache the daemon pushes at its expiry, with the fix when a summary is ready", async () => {
        const { configDir, folder, projectDir } = project();
        fs.mkdirSync(projectDir, { recursive: true });
        const transcript = path.join(projectDir, "s.jsonl");
        fs.writeFileSync(transcript, "");
        const d = daemon();
        const observed = new ObservedSessions(d, () => configDir);
        await observed.observe([folder]);
        const caseNamed = (name: string) => {
            const found = renderCases.cacheCases.find((c) => c.name === name);
            assert.ok(found, name);
            return found;
        };
        const shown = () => observedText(observed.shown() ?? assert.fail("no session shown"));
        d.push(observeId(transcript), "ok", caseNamed("warm").cache);
        assert.equal(
            shown(),
            "$(dashboard) ctx 0.0% · 67.0k to compact · 0",
            "warm: nothing to add",
        );
        const cold = caseNamed("cold with a summary ready");
        d.push(observeId(transcript), "ok", cold.cache);
        assert.equal(shown(), `$(dashboard) ctx 0.0% · 67.0k to compact · 0 · ${cold.text}`);
        assert.ok(shown().endsWith("; /compact is instant (summary ready)"));
        const plain = caseNamed("cold, nothing prepared");
        d.push(observeId(transcript), "ok", plain.cache);
        assert.ok(shown().endsWith(` · ${plain.text}`), shown());
        observed.dispose();
    });
});
