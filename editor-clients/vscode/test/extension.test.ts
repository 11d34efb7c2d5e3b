/**
 * The whole extension: `activate()` with the stand-in `vscode` module, its real
 * `LanguageClient` starting the real ctxd, the API another extension would call, and a
 * crash of the daemon followed by the client's restart.
 */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, afterEach, before, describe, it } from "node:test";

import type { CtxdApi } from "../src/extension";
import * as extension from "../src/extension";
import type { UsageChangedNotification } from "../src/lsp_ext";
import { DAEMON_DOWN_TEXT } from "../src/render";
import { ctxdBin, EMPTY_CWD, packageRoot, tempStateDir } from "./support/daemon";
import { childPids } from "./support/processes";
import { assistantRecord, userRecord } from "./support/records";
import { fake } from "./support/vscode";
import { waitFor } from "./support/wait";

const MODEL = "claude-sonnet-4-5-20250929";
/** The daemon's process name as /proc shows it (at most 15 characters). */
const daemonName = path.basename(ctxdBin()).slice(0, 15);

describe("activate() on a real ctxd", () => {
    const subscriptions: { dispose(): unknown }[] = [];
    let api: CtxdApi;
    let changes: UsageChangedNotification[];
    /** The sessions the current case opened: each case opens its own and closes them after. */
    let opened: string[] = [];

    before(async () => {
        fake.reset();
        // The offline summarizer: compactions never reach a provider, whatever the environment.
        fake.config = {
            path: ctxdBin(),
            stateDir: tempStateDir(),
            autoCompactWindow: 100_000,
            provider: "offline",
            logLevel: "debug",
        };
        api = await extension.activate({ subscriptions } as never);
        changes = [];
        api.onUsageChanged((c) => changes.push(c));
    });
    afterEach(async () => {
        for (const sessionId of opened) {
            await api.closeSession(sessionId);
        }
        opened = [];
    });
    after(async () => {
        for (const s of subscriptions) {
            await s.dispose();
        }
    });

    /**
     * A session of this case's own, whose transcript's last reply reported `tokens`, once
     * its status bar item shows `text`.
     */
    async function sessionAt(
        tokens: number,
        text: string,
    ): Promise<{ sessionId: string; item: (typeof fake.statusBarItems)[number] }> {
        const { sessionId } = await api.openSession({ cwd: EMPTY_CWD, model: MODEL });
        opened.push(sessionId);
        const user = userRecord("hi");
        await api.append(sessionId, [user, assistantRecord(tokens, user.uuid as string)]);
        const item = await waitFor(`the status bar of ${sessionId} at "${text}"`, () =>
            fake.statusBarItems.find(
                (i) => i.id === `ctxd.session.${sessionId}` && i.text === text,
            ),
        );
        return { sessionId, item };
    }

    it("starts the daemon with the settings and returns the API", () => {
        assert.deepEqual(fake.messages, [], "no error on start");
        assert.equal(api.apiVersion, 1);
        assert.equal(childPids(daemonName).length, 1);
        const [log] = fake.outputChannels;
        assert.equal(log.name, "ctxd");
        assert.ok(
            log.lines.some((l) => l.startsWith("[info] ctxd: ctxd starting")),
            "daemon log in the channel",
        );
    });

    it("opens a session, shows its status bar item, and follows ctx/usageChanged", async () => {
        const { sessionId, usage } = await api.openSession({ cwd: EMPTY_CWD, model: MODEL });
        opened.push(sessionId);
        assert.equal(usage.window, 100_000, "autoCompactWindow reached the daemon");
        const item = fake.statusBarItems.find((i) => i.id === `ctxd.session.${sessionId}`);
        assert.ok(item);
        assert.equal(item.text, "$(dashboard) ctx 0.0% · 67.0k to compact");
        const user = userRecord("hi");
        await api.append(sessionId, [user, assistantRecord(50_060, user.uuid as string)]);
        await waitFor("the status bar at 50.1%", () =>
            item.text.includes("50.1%") ? true : undefined,
        );
        assert.equal(item.text, "$(warning) ctx 50.1% · 16.9k to compact");
    });

    it("sends changed settings with workspace/didChangeConfiguration; the open session follows", async () => {
        const { item } = await sessionAt(50_060, "$(warning) ctx 50.1% · 16.9k to compact");
        const changeSetting = (value: boolean) => {
            fake.config.autoCompactEnabled = value;
            fake.configurationChanged.fire({
                affectsConfiguration: (section) =>
                    section === "ctxd" || section === "ctxd.autoCompactEnabled",
            });
        };
        // The daemon recomputes the session's levels and pushes its usage.
        changeSetting(false);
        await waitFor("auto-compact off", () =>
            item.text === "$(warning) ctx 50.1% · auto-compact off" ? true : undefined,
        );
        changeSetting(true);
        await waitFor("auto-compact on again", () =>
            item.text === "$(warning) ctx 50.1% · 16.9k to compact" ? true : undefined,
        );
        const [log] = fake.outputChannels;
        assert.deepEqual(
            log.lines.filter((l) => /unknown key|settings problem/.test(l)),
            [],
            "the daemon took every key the extension sent",
        );
    });

    it("registers every command package.json contributes, and no other", () => {
        // What activate() registers, whichever module registers it (a command missing
        // here is one the palette shows and VS Code cannot run).
        const manifest = JSON.parse(
            fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"),
        ) as {
            contributes: { commands: { command: string }[] };
        };
        const contributed = manifest.contributes.commands.map((c) => c.command).sort();
        assert.ok(
            contributed.includes("ctxd.searchHistory"),
            "package.json contributes ctxd.searchHistory",
        );
        assert.deepEqual([...fake.commands.keys()].sort(), contributed);
    });

    it("shows the log on command", async () => {
        const shown = fake.outputShown;
        await fake.commands.get("ctxd.showLog")?.();
        assert.equal(fake.outputShown, shown + 1);
    });

    it("restarts a crashed daemon and resumes the session; the status bar follows again", async () => {
        const { sessionId, item } = await sessionAt(
            50_060,
            "$(warning) ctx 50.1% · 16.9k to compact",
        );
        const status = fake.statusBarItems.find((i) => i.id === "ctxd.status");
        assert.ok(status);
        const statusBefore = status.texts.length;
        const [pid] = childPids(daemonName);
        process.kill(pid, "SIGKILL");
        await waitFor("a new daemon", () => {
            const pids = childPids(daemonName);
            return pids.length === 1 && pids[0] !== pid ? true : undefined;
        });
        await waitFor("the session resumed", () => {
            const down = item.texts.lastIndexOf(DAEMON_DOWN_TEXT);
            return down >= 0 && item.texts.slice(down).some((t) => t.includes("50.1%"))
                ? true
                : undefined;
        });
        // The daemon's own item counted down to the restart, then said ready again.
        const texts = status.texts.slice(statusBefore);
        const restarting = texts.findIndex((t) =>
            /^\$\(debug-disconnect\) ctxd restarting in \d+ s$/.test(t),
        );
        assert.ok(restarting >= 0, JSON.stringify(texts));
        assert.ok(texts.slice(restarting).includes("$(pulse) ctxd ready"), JSON.stringify(texts));
        const before = changes.length;
        const user = userRecord("after the crash");
        await api.append(sessionId, [user, assistantRecord(60_000, user.uuid as string)]);
        await waitFor("the status bar at 60.0%", () =>
            item.text.includes("60.0%") ? true : undefined,
        );
        assert.ok(changes.slice(before).some((c) => c.sessionId === sessionId));
        assert.equal(item.text, "$(warning) ctx 60.0% · 7.0k to compact");
    });

    it("reports an automatic compaction at the threshold; the status bar follows", async () => {
        const { sessionId, item } = await sessionAt(
            60_000,
            "$(warning) ctx 60.0% · 7.0k to compact",
        );
        fake.messages = [];
        const user = userRecord("past the threshold");
        await api.append(sessionId, [user, assistantRecord(70_000, user.uuid as string)]);
        const message = await waitFor("the compaction message", () =>
            fake.messages.find((m) => m.text.startsWith("ctxd: compacted")),
        );
        assert.equal(message.kind, "info");
        assert.match(message.text, /^ctxd: compacted \(auto\) 70,\d{3} → [\d,]+ tokens\.$/);
        await waitFor("the status bar after the compaction", () =>
            item.text.startsWith("$(dashboard) ctx ") ? true : undefined,
        );
        assert.equal(api.sessions().find((s) => s.sessionId === sessionId)?.usage?.level, "ok");
    });
});
