/**
 * The clients' docs against what the code and the daemon do: the README's settings
 * table names every setting the extension contributes, and no other (a setting added to
 * package.json without a line in the README fails here); the status line the docs give
 * as an example is the one a daemon with its default settings shows for the model they
 * name (an example no user can see fails here).
 */
import "./support/installVscode";

import * as assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";

import { claudeProjectDir, ObservedSessions } from "../src/claude";
import { observedText } from "../src/daemonStatus";
import type { UsageChangedNotification } from "../src/lsp_ext";
import { packageRoot, startDaemon, tempStateDir } from "./support/daemon";
import { waitFor } from "./support/wait";

/** The settings named in the first column of the README's `## Settings` table. */
function readmeSettings(): string[] {
    const readme = fs.readFileSync(path.join(packageRoot, "README.md"), "utf8");
    const section = readme.split(/^## /m).find((s) => s.startsWith("Settings\n"));
    assert.ok(section, "the README has a Settings section");
    const rows = section.split("\n").filter((l) => l.startsWith("| `ctxd."));
    return rows.flatMap((row) =>
        [...row.split("|")[1].matchAll(/`(ctxd\.[A-Za-z.]+)`/g)].map((m) => m[1]),
    );
}

/** The docs of both clients that show an observed session's status line. */
const DOCS = ["README.md", "../neovim/README.md", "../neovim/doc/ctxd.txt"].map((p) =>
    path.join(packageRoot, p),
);

/** A Claude Code transcript of one turn of `model` whose context holds `tokens`. */
function transcript(model: string, tokens: number): string {
    const base = {
        sessionId: "s",
        timestamp: new Date().toISOString(),
        cwd: os.tmpdir(),
        version: "2.1.332",
    };
    const user = {
        ...base,
        uuid: randomUUID(),
        parentUuid: null,
        type: "user",
        message: { role: "user", content: "go on" },
    };
    const assistant = {
        ...base,
        uuid: randomUUID(),
        parentUuid: user.uuid,
        type: "assistant",
        message: {
            id: `msg_${randomUUID()}`,
            role: "assistant",
            model,
            content: [{ type: "text", text: "done" }],
            usage: {
                input_tokens: 10,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: tokens - 60,
                output_tokens: 50,
            },
        },
    };
    return `${JSON.stringify(user)}\n${JSON.stringify(assistant)}\n`;
}

describe("README", () => {
    it("lists every setting of package.json's contributes.configuration, and only those", () => {
        const manifest = JSON.parse(
            fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"),
        );
        const contributed = Object.keys(manifest.contributes.configuration.properties).sort();
        assert.ok(contributed.includes("ctxd.claudeIdleCompaction"));
        assert.deepEqual([...readmeSettings()].sort(), contributed);
    });

    it("gives status lines a daemon with its default settings shows for the models they name", async () => {
        // No autoCompactWindow: the model table's windows, as a new user has them.
        const daemon = await startDaemon(tempStateDir(), { settings: { provider: "offline" } });
        const configDir = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-readme-"));
        const observed = new ObservedSessions(
            {
                request: (method, params) => daemon.connection.request(method, params),
                onUsageChanged: (listener) => {
                    daemon.connection.onNotification("ctx/usageChanged", (p) =>
                        listener(p as UsageChangedNotification),
                    );
                    return { dispose: () => undefined };
                },
            },
            () => configDir,
        );
        /** The status item's text (without its icon) of a folder whose one transcript is at `tokens` of `model`. */
        const shown = async (model: string, tokens: number): Promise<string> => {
            const folder = path.join(configDir, model);
            const projectDir = claudeProjectDir(folder, configDir);
            fs.mkdirSync(projectDir, { recursive: true });
            fs.writeFileSync(
                path.join(projectDir, `${randomUUID()}.jsonl`),
                transcript(model, tokens),
            );
            await observed.observe([folder]);
            const session = await waitFor(`the usage of ${model}`, () =>
                observed.sessions().find((s) => s.folder === folder && s.usage !== undefined),
            );
            return observedText(session).replace(/^\$\([^)]*\) /, "");
        };
        try {
            const opus = await shown("claude-opus-4-6", 90_000);
            assert.equal(opus, "ctx 45.0% · 77.0k to compact · 90.0k · claude-opus-4-6");
            // The docs say a model Claude Code does not auto-compact shows this.
            const sonnet = await shown("claude-sonnet-4-5", 90_000);
            assert.equal(sonnet, "ctx 45.0% · auto-compact off · 90.0k · claude-sonnet-4-5");
            for (const doc of DOCS) {
                const text = fs.readFileSync(doc, "utf8");
                const examples = [
                    ...text.matchAll(/ctx \d+\.\d% · [^`\n]* · claude-[a-z0-9-]+/g),
                ].map((m) => m[0]);
                assert.ok(examples.length > 0, `${doc} shows an observed session's status line`);
                for (const example of examples) {
                    assert.ok(
                        [opus, sonnet].includes(example),
                        `${doc}: ${example} is not what ctxd shows (${opus})`,
                    );
                }
            }
        } finally {
            observed.dispose();
            await daemon.stop();
        }
    });
});
