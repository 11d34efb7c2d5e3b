/**
 * The extension as a new user meets it, on the real ctxd: a start that fails (not found,
 * not executable, exits with an error) is named in the status item and recovered from
 * without a reload, and with no agent extension the Claude Code sessions of the
 * workspace folders show up on their own.
 */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, afterEach, before, describe, it } from "node:test";

import { claudeProjectDir, observeId } from "../src/claude";
import { COMPACT_INSTEAD, FOLLOW_NEWEST } from "../src/commands";
import type { CtxdApi } from "../src/extension";
import * as extension from "../src/extension";
import { ctxdBin, tempStateDir, EMPTY_CWD } from "./support/daemon";
import { childPids } from "./support/processes";
import { fake, type FakeStatusBarItem } from "./support/vscode";
import { waitFor } from "./support/wait";

// A model Claude Code auto-compacts (claude-sonnet-4-5 gets no "to compact" figure).
const MODEL = "claude-opus-4-6";

/** A Claude Code transcript line: a user prompt, or an assistant turn at `contextTokens`. */
function claudeLine(kind: "user" | "assistant", contextTokens = 0): string {
    const base = {
        uuid: randomUUID(),
        sessionId: "s",
        timestamp: new Date().toISOString(),
        cwd: os.tmpdir(),
        version: "2.1.0",
    };
    if (kind === "user") {
        return JSON.stringify({
            ...base,
            type: "user",
            message: { role: "user", content: "go on" },
        });
    }
    return JSON.stringify({
        ...base,
        type: "assistant",
        message: {
            id: `msg_${randomUUID()}`,
            role: "assistant",
            model: MODEL,
            content: [{ type: "text", text: "done" }],
            usage: {
                input_tokens: 10,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: contextTokens - 60,
                output_tokens: 50,
            },
        },
    });
}

function status(): FakeStatusBarItem {
    const item = fake.statusBarItems.find((i) => i.id === "ctxd.status");
    assert.ok(item, "the status item exists from activation");
    return item;
}

/** The status item's last texts and the client's last log lines, for a timeout's message. */
function recent(): string {
    const log = fake.outputChannels.flatMap((c) => c.lines).slice(-12);
    return [`status texts: ${JSON.stringify(status().texts.slice(-6))}`, "log:", ...log].join("\n");
}

/** The tokens of the latest usage the daemon pushed for the observed `transcript`, per the log of usage seen. */
const seenUsage = new Map<string, number>();
function observedUsage(transcript: string): number | undefined {
    return seenUsage.get(observeId(transcript));
}

function changeSetting(key: string, value: unknown): void {
    fake.config[key] = value;
    fake.configurationChanged.fire({
        affectsConfiguration: (section) => section === "ctxd" || section === `ctxd.${key}`,
    });
}

describe("a new user's workspace on a real ctxd", () => {
    const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-vscode-workspace-"));
    const claudeDir = path.join(scratch, "claude");
    /** The extension each case activates for itself, disposed after it. */
    let subscriptions: { dispose(): unknown }[] = [];
    let cases = 0;

    before(() => {
        process.env.CLAUDE_CONFIG_DIR = claudeDir;
    });
    afterEach(async () => {
        for (const s of subscriptions) {
            await s.dispose();
        }
        subscriptions = [];
    });
    after(() => {
        delete process.env.CLAUDE_CONFIG_DIR;
    });

    /**
     * A workspace folder of the calling case's own (its name has characters Claude Code
     * replaces in a project folder's name: `/`, `.` and `_`), and the extension activated
     * on it with the daemon at `binary`.
     */
    async function activated(
        binary: string,
        folder = newFolder(),
    ): Promise<{ api: CtxdApi; folder: string; projectDir: string }> {
        fake.reset();
        fake.workspaceFolders = [folder];
        fake.config = {
            path: binary,
            stateDir: tempStateDir(),
            autoCompactWindow: 100_000,
            provider: "offline",
        };
        const api = await extension.activate({ subscriptions } as never);
        seenUsage.clear();
        api.onUsageChanged(({ sessionId, usage }) => seenUsage.set(sessionId, usage.tokens));
        return { api, folder, projectDir: claudeProjectDir(folder, claudeDir) };
    }

    /** A workspace folder of the calling case's own, `my.project_1` unless named. */
    function newFolder(name = "my.project_1"): string {
        cases += 1;
        const folder = path.join(scratch, `case-${cases}`, name);
        fs.mkdirSync(folder, { recursive: true });
        return folder;
    }

    /**
     * The extension on the real daemon with one Claude Code session of the workspace
     * observed: two turns, the last at 60,000 tokens, shown in the status item.
     */
    async function observedSession(): Promise<{
        api: CtxdApi;
        projectDir: string;
        transcript: string;
    }> {
        const { api, projectDir } = await activated(ctxdBin());
        await waitFor(
            "the daemon ready",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            10_000,
            recent,
        );
        fs.mkdirSync(projectDir, { recursive: true });
        const transcript = path.join(projectDir, `${randomUUID()}.jsonl`);
        const turns = [
            claudeLine("user"),
            claudeLine("assistant", 40_000),
            claudeLine("user"),
            claudeLine("assistant", 60_000),
        ];
        fs.writeFileSync(transcript, `${turns.join("\n")}\n`);
        await waitFor(
            "the observed session",
            () =>
                status().text === "$(warning) ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6"
                    ? true
                    : undefined,
            10_000,
            recent,
        );
        return { api, projectDir, transcript };
    }

    /**
     * Two Claude Code sessions in a new folder's project directory, the older written an
     * hour ago (Claude Code resumes it later), and the extension activated on the folder.
     */
    async function twoSessionsActivated(): Promise<{ older: string; newer: string }> {
        const folder = newFolder();
        const projectDir = claudeProjectDir(folder, claudeDir);
        fs.mkdirSync(projectDir, { recursive: true });
        const older = path.join(projectDir, `${randomUUID()}.jsonl`);
        fs.writeFileSync(older, `${claudeLine("user")}\n${claudeLine("assistant", 10_000)}\n`);
        fs.utimesSync(older, new Date(Date.now() - 3_600_000), new Date(Date.now() - 3_600_000));
        const newer = path.join(projectDir, `${randomUUID()}.jsonl`);
        fs.writeFileSync(newer, `${claudeLine("user")}\n${claudeLine("assistant", 40_000)}\n`);
        await activated(ctxdBin(), folder);
        return { older, newer };
    }

    it("names the project folder as Claude Code does", () => {
        const folder = path.join(scratch, "my.project_1");
        const projectDir = claudeProjectDir(folder, claudeDir);
        assert.equal(path.basename(projectDir), folder.replace(/[^A-Za-z0-9]/g, "-"));
        assert.ok(path.basename(projectDir).endsWith("-my-project-1"));
    });

    it("says the binary was not found in the status item and one notification, which goes once the daemon runs", async () => {
        await activated(path.join(scratch, "no-such-ctxd"));
        assert.match(status().text, /^\$\(error\) ctxd failed: not found · retrying in 1 s$/);
        assert.match(
            status().tooltipText,
            new RegExp(
                `^ctxd could not start: not found: ${path.join(scratch, "no-such-ctxd")} does not exist\n\nIt tries again in 1 s on its own`,
            ),
        );
        assert.equal((status().command as { command: string }).command, "ctxd.fixStart");
        assert.ok(
            status().texts.includes("$(loading~spin) ctxd starting"),
            "starting was shown first",
        );
        // One notification, not an error toast that outlives the failure.
        assert.deepEqual(fake.messages, []);
        const open = fake.notifications.filter((n) => n.open);
        assert.equal(open.length, 1);
        assert.equal(open[0].title, "ctxd did not start");
        assert.match(
            open[0].message,
            /^not found: .*no-such-ctxd does not exist\. It tries again on its own; to fix it, set ctxd\.path to the ctxd binary/,
        );
        changeSetting("path", ctxdBin());
        await waitFor(
            "the daemon ready",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            10_000,
            recent,
        );
        assert.deepEqual(
            fake.notifications.filter((n) => n.open),
            [],
            "the notification went away",
        );
        assert.equal(fake.notifications.length, 1, "and it was shown once, through the retries");
    });

    it("says a file is not executable", async () => {
        await activated(path.join(scratch, "no-such-ctxd"));
        const notExecutable = path.join(scratch, "ctxd-no-x");
        fs.writeFileSync(notExecutable, "#!/bin/sh\n", { mode: 0o644 });
        fake.config.path = notExecutable;
        await fake.commands.get("ctxd.restart")?.();
        assert.match(
            status().text,
            /^\$\(error\) ctxd failed: not executable · retrying in \d+ s$/,
        );
        assert.match(
            status().tooltipText,
            new RegExp(`not executable: ${notExecutable} \\(chmod \\+x it`),
        );
    });

    it("names the exit code and the last stderr lines of a daemon that exits at start, with no raw toast", async () => {
        await activated(path.join(scratch, "no-such-ctxd"));
        const failing = path.join(scratch, "ctxd-exits");
        fs.writeFileSync(
            failing,
            "#!/bin/sh\necho 'first line' >&2\necho 'error: cannot open the state directory' >&2\nexit 3\n",
            { mode: 0o755 },
        );
        fake.config.path = failing;
        await fake.commands.get("ctxd.restart")?.();
        const item = status();
        assert.match(
            item.text,
            /^\$\(error\) ctxd failed: exited with code 3 · retrying in \d+ s$/,
        );
        assert.match(
            item.tooltipText,
            /exited with code 3: first line \| error: cannot open the state directory/,
        );
        // The language client's own words (write EPIPE, "connection to server is erroring",
        // "Server initialization failed") never reach the user.
        assert.deepEqual(fake.messages, []);
    });

    it("retries a failed start on its own, counting down in the item, and recovers with no command", async () => {
        const later = path.join(scratch, "ctxd-installed-later");
        await activated(later);
        assert.match(status().text, /^\$\(error\) ctxd failed: not found · retrying in 1 s$/);
        // The binary appears where the setting points: the next retry finds it.
        fs.copyFileSync(ctxdBin(), later);
        fs.chmodSync(later, 0o755);
        await waitFor(
            "ready without a command",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            30_000,
            recent,
        );
        assert.deepEqual(
            fake.notifications.filter((n) => n.open),
            [],
        );
        assert.deepEqual(fake.messages, []);
    });

    it("starts the back-off over on a manual restart", async () => {
        const failing = path.join(scratch, "ctxd-fails-fast");
        fs.writeFileSync(failing, "#!/bin/sh\nexit 4\n", { mode: 0o755 });
        await activated(failing);
        // 0.5 s, 1 s, 2 s, then 4 s: the back-off has grown.
        await waitFor(
            "a 4 s wait",
            () => (status().texts.some((t) => t.endsWith("· retrying in 4 s")) ? true : undefined),
            30_000,
            recent,
        );
        await fake.commands.get("ctxd.restart")?.();
        assert.match(
            status().text,
            /^\$\(error\) ctxd failed: exited with code 4 · retrying in 1 s$/,
            "half a second again, shown as 1 s",
        );
    });

    it("starts a fresh client when the path is fixed, from the failed state, without a reload", async () => {
        await activated(path.join(scratch, "no-such-ctxd"));
        assert.match(status().text, /^\$\(error\) ctxd failed: not found · /);
        changeSetting("path", ctxdBin());
        await waitFor(
            "the daemon ready",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            10_000,
            recent,
        );
        // The folder's Claude Code project has no transcript yet: the tooltip says so.
        await waitFor("the reason in the tooltip", () =>
            /No Claude Code session yet:\n- .*my\.project_1: /.test(status().tooltipText)
                ? true
                : undefined,
        );
        // And the restart command, from a running client: a new start, then ready again.
        const shown = status().texts.length;
        await fake.commands.get("ctxd.restart")?.();
        await waitFor(
            "ready again",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            10_000,
            recent,
        );
        assert.ok(status().texts.slice(shown).includes("$(loading~spin) ctxd starting"));
    });

    it("names the cause when a restart after a crash fails (the binary went away), and recovers", async () => {
        const moved = path.join(scratch, "ctxd-moved-away");
        fs.copyFileSync(ctxdBin(), moved);
        fs.chmodSync(moved, 0o755);
        await activated(moved);
        await waitFor(
            "ready on the copy",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            30_000,
            recent,
        );
        const [pid] = childPids(path.basename(moved).slice(0, 15));
        fs.rmSync(moved);
        process.kill(pid, "SIGKILL");
        await waitFor(
            "the restart to fail",
            () =>
                status().text.startsWith("$(error) ctxd failed: not found · retrying in ")
                    ? true
                    : undefined,
            10_000,
            recent,
        );
        assert.ok(
            status().texts.some((t) => /^\$\(debug-disconnect\) ctxd restarting in \d+ s$/.test(t)),
            "the countdown came first",
        );
        assert.match(status().tooltipText, new RegExp(`not found: ${moved} does not exist`));
        changeSetting("path", ctxdBin());
        await waitFor(
            "ready again",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            30_000,
            recent,
        );
        // Neither the crash nor the failed restart showed the language client's raw
        // toasts, nor logged its "will not be restarted" as an error.
        assert.deepEqual(fake.messages, []);
        const log = fake.outputChannels.flatMap((c) => c.lines);
        assert.deepEqual(
            log.filter(
                (l) =>
                    l.startsWith("[error]") &&
                    /Server will not be restarted|Stopping server failed|connection to server is erroring|initialization failed/i.test(
                        l,
                    ),
            ),
            [],
        );
    });

    it("shows the workspace's Claude Code session once its transcript appears, and follows it", async () => {
        const { projectDir } = await activated(ctxdBin());
        await waitFor(
            "the daemon ready",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            10_000,
            recent,
        );
        fs.mkdirSync(projectDir, { recursive: true });
        const transcript = path.join(projectDir, `${randomUUID()}.jsonl`);
        fs.writeFileSync(transcript, `${claudeLine("user")}\n${claudeLine("assistant", 40_000)}\n`);
        const first = await waitFor("the observed session", () =>
            status().text.includes("ctx 40.0%") ? status().text : undefined,
        );
        assert.equal(first, "$(dashboard) ctx 40.0% · 27.0k to compact · 40.0k · claude-opus-4-6");
        assert.equal(
            (status().command as { arguments: unknown[] }).arguments[0],
            observeId(transcript),
        );
        // Claude Code appends a turn: the item follows.
        fs.appendFileSync(
            transcript,
            `${claudeLine("user")}\n${claudeLine("assistant", 60_000)}\n`,
        );
        const next = await waitFor("the next turn", () =>
            status().text.includes("ctx 60.0%") ? status().text : undefined,
        );
        assert.equal(next, "$(warning) ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6");
    });

    it("opens the context view of the observed session from the item", async () => {
        const { transcript } = await observedSession();
        const command = status().command as { command: string; arguments: unknown[] };
        await fake.commands.get(command.command)?.(...command.arguments);
        const document = fake.shownDocuments.at(-1);
        assert.ok(document);
        const text = document.getText();
        assert.match(text, /^# ctxd context: observe-[0-9a-f]{16}/);
        assert.ok(
            text.includes(`Claude Code session ${path.basename(transcript, ".jsonl")}`),
            text,
        );
        assert.ok(text.includes("**ctx 60.0% · 7.0k to compact**"), text);
    });

    it("offers the Claude Code compaction with a confirmation, and compacts once confirmed", async () => {
        await observedSession();
        fake.messages = [];
        fake.messageAnswer = undefined; // the confirmation dismissed: nothing is sent
        await fake.commands.get("ctxd.compact")?.();
        assert.equal(fake.messages.length, 1);
        assert.match(
            fake.messages[0].text,
            /appends a compact boundary and a summary to .*\.jsonl.*Undo last compaction/,
        );
        fake.messages = [];
        fake.messageAnswer = "Compact";
        fake.inputAnswers = [""];
        await fake.commands.get("ctxd.compact")?.();
        const last = fake.messages.at(-1);
        assert.ok(last);
        // No provider is configured in the test's home: the built-in summarizer wrote it.
        assert.match(
            last.text,
            /^ctxd: Claude Code session compacted .* tokens, summary by offline\.$/,
        );
        fake.messageAnswer = undefined;
    });

    it("shows the session that changed last; picking one pins it to the item, and the first entry unpins", async () => {
        const { projectDir, transcript } = await observedSession();
        const second = path.join(projectDir, `${randomUUID()}.jsonl`);
        fs.writeFileSync(second, `${claudeLine("user")}\n${claudeLine("assistant", 20_000)}\n`);
        await waitFor("the new session shown", () =>
            status().text.includes("ctx 20.0%") ? true : undefined,
        );
        let offered: { label: string; description?: string }[] = [];
        fake.quickPick = (items) => {
            offered = items as typeof offered;
            return items[1];
        };
        await fake.commands.get("ctxd.pickClaudeSession")?.();
        assert.equal(offered.length, 2);
        assert.deepEqual(
            [offered[0].label, offered[0].description],
            ["ctx 20.0% · 47.0k to compact · 20.0k · claude-opus-4-6", "in the status bar"],
        );
        assert.deepEqual(
            [offered[1].label, offered[1].description],
            ["ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6", undefined],
        );
        assert.match(
            fake.shownDocuments.at(-1)?.getText() ?? "",
            new RegExp(`# ctxd context: ${observeId(transcript)}`),
        );
        // The picked session is in the status item now, and stays while the other changes.
        assert.equal(
            status().text,
            "$(warning) ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6",
        );
        fs.appendFileSync(second, `${claudeLine("user")}\n${claudeLine("assistant", 30_000)}\n`);
        await waitFor(
            "the other session's turn read",
            () => (observedUsage(second) === 30_000 ? true : undefined),
            10_000,
            recent,
        );
        assert.equal(
            status().text,
            "$(warning) ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6",
        );
        // The first entry follows the session that changed last again.
        fake.quickPick = (items) => {
            offered = items as typeof offered;
            return items[0];
        };
        await fake.commands.get("ctxd.pickClaudeSession")?.();
        assert.equal(offered[0].label, FOLLOW_NEWEST);
        await waitFor(
            "the newest again",
            () => (status().text.includes("ctx 30.0%") ? true : undefined),
            10_000,
            recent,
        );
    });

    it("lists every transcript of the folder, also one the daemon does not follow, and shows it when picked", async () => {
        const { older, newer } = await twoSessionsActivated();
        await waitFor(
            "the newest session",
            () => (status().text.includes("ctx 40.0%") ? true : undefined),
            10_000,
            recent,
        );
        let offered: { label: string; detail?: string }[] = [];
        fake.quickPick = (items) => {
            offered = items as typeof offered;
            return items[1];
        };
        await fake.commands.get("ctxd.pickClaudeSession")?.();
        const olderText = "ctx 10.0% · 57.0k to compact · 10.0k · claude-opus-4-6";
        assert.deepEqual(
            offered.map((o) => o.detail?.split("  ")[0]),
            [path.basename(newer, ".jsonl"), path.basename(older, ".jsonl")],
        );
        assert.equal(offered[0].label, "ctx 40.0% · 27.0k to compact · 40.0k · claude-opus-4-6");
        // A daemon that follows only the newest transcript has sent nothing for the older one.
        assert.ok(["not followed yet", olderText].includes(offered[1].label), offered[1].label);
        await waitFor(
            "the older session in the item",
            () => (status().text === `$(dashboard) ${olderText}` ? true : undefined),
            10_000,
            recent,
        );
        assert.match(
            fake.shownDocuments.at(-1)?.getText() ?? "",
            new RegExp(`# ctxd context: ${observeId(older)}`),
        );
    });

    // Issue #37 item 1: a follower that reads on from the old end of a file cut back shows
    // the compacted figure after undo and misses the turns written after it.
    it("after Compact then Undo last compaction, shows the figure from before the compaction, then the next turn", async () => {
        const { transcript } = await observedSession();
        const before = "$(warning) ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6";
        fake.messages = [];
        fake.messageAnswer = "Compact";
        fake.inputAnswers = [""];
        await fake.commands.get("ctxd.compact")?.();
        fake.messageAnswer = undefined;
        assert.match(fake.messages.at(-1)?.text ?? "", /^ctxd: Claude Code session compacted /);
        await waitFor(
            "the compacted figure in the item",
            () =>
                (observedUsage(transcript) ?? 60_000) < 60_000 && status().text !== before
                    ? true
                    : undefined,
            10_000,
            recent,
        );
        const compactedSize = fs.statSync(transcript).size;

        await fake.commands.get("ctxd.undoCompact")?.();
        assert.match(
            fake.messages.at(-1)?.text ?? "",
            /^ctxd: the Claude Code session's last compaction is undone/,
        );
        assert.ok(fs.statSync(transcript).size < compactedSize, "undo cut the transcript back");
        await waitFor(
            "the figure from before the compaction again",
            () => (status().text === before ? true : undefined),
            10_000,
            recent,
        );

        // Claude Code goes on from the restored transcript: its next turn is shown.
        fs.appendFileSync(
            transcript,
            `${claudeLine("user")}\n${claudeLine("assistant", 50_000)}\n`,
        );
        await waitFor(
            "the turn after the undo",
            () =>
                status().text.endsWith(" ctx 50.0% · 17.0k to compact · 50.0k · claude-opus-4-6")
                    ? true
                    : undefined,
            10_000,
            recent,
        );
        assert.equal(
            (status().command as { arguments: unknown[] }).arguments[0],
            observeId(transcript),
        );
    });

    // Issue #37 item 2: `claude --resume` appends to an older transcript of the folder; a
    // daemon that follows only the newest at start sends nothing for it.
    it("shows an older session of the folder that Claude Code resumes, unless another is pinned", async () => {
        const { older, newer } = await twoSessionsActivated();
        const newest = "$(dashboard) ctx 40.0% · 27.0k to compact · 40.0k · claude-opus-4-6";
        await waitFor(
            "the newest session",
            () => (status().text === newest ? true : undefined),
            10_000,
            recent,
        );

        // Resumed: the older session is written to, and the item follows it.
        fs.appendFileSync(older, `${claudeLine("user")}\n${claudeLine("assistant", 20_000)}\n`);
        await waitFor(
            "the resumed session in the item",
            () =>
                status().text ===
                "$(dashboard) ctx 20.0% · 47.0k to compact · 20.0k · claude-opus-4-6"
                    ? true
                    : undefined,
            10_000,
            recent,
        );
        assert.equal((status().command as { arguments: unknown[] }).arguments[0], observeId(older));
        // And stays followed: its next turn shows too.
        fs.appendFileSync(older, `${claudeLine("user")}\n${claudeLine("assistant", 30_000)}\n`);
        await waitFor(
            "the resumed session's next turn",
            () =>
                status().text ===
                "$(dashboard) ctx 30.0% · 37.0k to compact · 30.0k · claude-opus-4-6"
                    ? true
                    : undefined,
            10_000,
            recent,
        );

        // The user picks the newer session (listed second now): a turn of the resumed one
        // is read, not shown.
        fake.quickPick = (items) =>
            items.find((i) =>
                (i as { detail?: string }).detail?.startsWith(path.basename(newer, ".jsonl")),
            );
        await fake.commands.get("ctxd.pickClaudeSession")?.();
        await waitFor(
            "the picked session in the item",
            () => (status().text === newest ? true : undefined),
            10_000,
            recent,
        );
        fs.appendFileSync(older, `${claudeLine("user")}\n${claudeLine("assistant", 35_000)}\n`);
        await waitFor(
            "the resumed session's turn read",
            () => (observedUsage(older) === 35_000 ? true : undefined),
            10_000,
            recent,
        );
        assert.equal(status().text, newest);
    });

    it("turns observing Claude Code off and on at once, no reload", async () => {
        await observedSession();
        changeSetting("observeClaudeCode", false);
        await waitFor(
            "the item back to the daemon",
            () => (status().text === "$(pulse) ctxd ready" ? true : undefined),
            10_000,
            recent,
        );
        changeSetting("observeClaudeCode", true);
        await waitFor(
            "the session again",
            () => (status().text.includes("ctx 60.0%") ? true : undefined),
            10_000,
            recent,
        );
        assert.deepEqual(fake.messages, [], "nothing asked for a reload");
    });

    it("explains Clear session on a Claude Code session, and offers to compact it instead", async () => {
        const { transcript } = await observedSession();
        fake.messages = [];
        await fake.commands.get("ctxd.clear")?.();
        assert.equal(fake.messages.length, 1);
        assert.equal(fake.messages[0].kind, "info");
        assert.match(
            fake.messages[0].text,
            new RegExp(
                `Claude Code session ${path.basename(transcript, ".jsonl")}, which Claude Code keeps, so ctxd does not clear it\\. Type /clear in Claude Code`,
            ),
        );
        assert.doesNotMatch(fake.messages[0].text, /no session is open|was found/);
        // "Compact it instead" leads to the Claude Code compaction's confirmation.
        fake.messages = [];
        fake.messageAnswer = COMPACT_INSTEAD;
        await fake.commands.get("ctxd.clear")?.();
        fake.messageAnswer = undefined;
        assert.match(
            fake.messages.at(-1)?.text ?? "",
            /^Compact the Claude Code session .*appends a compact boundary/,
        );
    });

    it("shows the sessions of the folder a symlinked workspace folder points to, as Claude Code names them", async () => {
        const real = newFolder("café-😀");
        const link = path.join(path.dirname(real), "link");
        fs.symlinkSync(real, link);
        // Claude Code started in the link names the project after the real path.
        const projectDir = path.join(
            claudeDir,
            "projects",
            fs.realpathSync(real).replace(/[^A-Za-z0-9]/g, "-"),
        );
        fs.mkdirSync(projectDir, { recursive: true });
        fs.writeFileSync(
            path.join(projectDir, `${randomUUID()}.jsonl`),
            `${claudeLine("user")}\n${claudeLine("assistant", 40_000)}\n`,
        );
        await activated(ctxdBin(), link);
        await waitFor(
            "the session of the real folder",
            () => (status().text.includes("ctx 40.0%") ? true : undefined),
            10_000,
            recent,
        );
    });

    it("gives way to an agent extension's own session", async () => {
        const { api } = await observedSession();
        const { sessionId } = await api.openSession({ cwd: EMPTY_CWD, model: MODEL });
        await waitFor("the item back to the daemon state", () =>
            status().text === "$(pulse) ctxd ready" ? true : undefined,
        );
        await api.closeSession(sessionId);
        await waitFor("the Claude Code session again", () =>
            status().text.includes("ctx 60.0%") ? true : undefined,
        );
    });
});
