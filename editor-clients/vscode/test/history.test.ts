/**
 * "Search this session's history" with the stand-in `vscode` module against the real
 * daemon: a Claude Code session (the project's real 2.1.332 transcript, with a
 * compaction in it) named by its id, and a session the extension opened itself.
 */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";

import { claudeProjectDir } from "../src/claude";
import {
    HISTORY_SCHEME,
    hitItem,
    registerHistory,
    renderRecord,
    SEARCH_HISTORY_COMMAND,
} from "../src/history";
import { CtxdSessions } from "../src/sessions";
import {
    packageRoot,
    startDaemon,
    TEST_SETTINGS,
    tempStateDir,
    type TestDaemon,
} from "./support/daemon";
import { userRecord } from "./support/records";
import { fake } from "./support/vscode";

const CLAUDE_SESSION = "b7d55388-c9ad-4169-a8d1-459fc6bdb46f";
const FIXTURE = path.join(
    packageRoot,
    "../../tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl",
);

// The daemon this file starts finds Claude Code's projects here (node runs each test
// file in its own process, so no other file sees this).
const configDir = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-history-claude-"));
process.env.CLAUDE_CONFIG_DIR = configDir;
const folder = path.join(configDir, "app");
fs.mkdirSync(claudeProjectDir(folder, configDir), { recursive: true });
fs.copyFileSync(FIXTURE, path.join(claudeProjectDir(folder, configDir), `${CLAUDE_SESSION}.jsonl`));

function run(...args: unknown[]): Promise<unknown> {
    const handler = fake.commands.get(SEARCH_HISTORY_COMMAND);
    assert.ok(handler, "the command is registered");
    return Promise.resolve(handler(...args));
}

describe("Search this session's history, on a real ctxd", () => {
    let daemon: TestDaemon;
    let sessions: CtxdSessions;
    let registered: { dispose(): unknown }[];

    beforeEach(async () => {
        fake.reset();
        daemon = await startDaemon(tempStateDir(), { settings: TEST_SETTINGS });
        sessions = new CtxdSessions();
        sessions.attach(daemon.connection);
        registered = registerHistory({ sessions });
    });
    afterEach(async () => {
        registered.forEach((d) => d.dispose());
        sessions.dispose();
        await daemon.stop();
    });

    it("finds what a Claude Code session read before its compaction and opens the record whole", async () => {
        fake.inputAnswers.push("MARKER-BIG");
        let offered: { label: string; description: string; hit: { role: string } }[] = [];
        fake.quickPick = (items) => {
            offered = items as typeof offered;
            return items[0];
        };
        await run(CLAUDE_SESSION);
        assert.deepEqual(fake.messages, [], JSON.stringify(fake.messages));
        assert.equal(offered.length, 1, JSON.stringify(offered));
        assert.equal(offered[0].description, "tool result · before compaction");
        assert.ok(offered[0].label.includes("MARKER-BIG"), offered[0].label);
        assert.equal(fake.shownDocuments.length, 1);
        const [document] = fake.shownDocuments;
        assert.equal(document.uri.scheme, HISTORY_SCHEME);
        const text = document.getText();
        assert.ok(
            text.includes("def f0(x):") && text.includes("(before compaction, the record found)"),
            text.slice(0, 800),
        );
        assert.ok(text.length > 5_000, "the whole record, not the snippet");
    });

    it("searches a session the extension opened; says when nothing is found; a failed request is one error", async () => {
        const cwd = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-history-cwd-"));
        const { sessionId } = await sessions.openSession({
            cwd,
            model: "claude-sonnet-4-5-20250929",
        });
        await sessions.append(sessionId, [userRecord("the heron flies at dawn")]);
        // The only session: no pick of the session, one of the hit.
        fake.inputAnswers.push("heron");
        await run();
        assert.equal(fake.shownDocuments.length, 1, JSON.stringify(fake.messages));
        assert.ok(fake.shownDocuments[0].getText().includes("the heron flies at dawn"));

        fake.inputAnswers.push("albatross");
        await run(sessionId);
        assert.deepEqual(fake.messages, [
            { kind: "info", text: 'ctxd: nothing found for "albatross".' },
        ]);

        fake.inputAnswers.push("heron");
        await run("no-such-session");
        assert.equal(fake.messages.length, 2);
        assert.equal(fake.messages[1].kind, "error");
        assert.ok(
            fake.messages[1].text.startsWith("ctxd could not search the session's history: "),
            fake.messages[1].text,
        );

        // A dismissed box asks nothing.
        fake.inputAnswers.push(undefined);
        await run(sessionId);
        assert.equal(fake.messages.length, 2);
    });
});

describe("history rendering", () => {
    it("shows a hit by its snippet, role, place and time", () => {
        const item = hitItem({
            sessionId: "s",
            uuid: "u-1",
            timestamp: "2026-11-29T21:19:52.130Z",
            role: "tool_result",
            snippet: "a\n  b",
            beforeCompaction: true,
            transcript: "/t.jsonl",
        });
        assert.deepEqual(item, {
            label: "a b",
            description: "tool result · before compaction",
            detail: "2026-11-29 21:19:52  u-1",
        });
    });

    it("renders a read as Markdown, the record found marked and a cut said", () => {
        const text = renderRecord({
            sessionId: "s",
            transcript: "/t.jsonl",
            truncated: "text cut",
            records: [
                {
                    uuid: "a",
                    role: "assistant",
                    text: "call",
                    target: false,
                    beforeCompaction: false,
                },
                {
                    uuid: "b",
                    role: "user",
                    text: "```inner fence```",
                    target: true,
                    beforeCompaction: true,
                    timestamp: "T",
                },
            ],
        });
        assert.ok(
            text.includes(
                "## ▶ user · T\n`b` (before compaction, the record found)\n\n````text\n```inner fence```\n````",
            ),
            text,
        );
        assert.ok(text.includes("## assistant\n`a`\n"), text);
        assert.ok(text.endsWith("> text cut\n"), text);
    });

    it("is contributed in package.json", () => {
        const manifest = JSON.parse(
            fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"),
        );
        const titles = manifest.contributes.commands.filter(
            (c: { command: string }) => c.command === SEARCH_HISTORY_COMMAND,
        );
        assert.equal(titles.length, 1);
        assert.equal(titles[0].title, "Search this session's history");
    });
});
