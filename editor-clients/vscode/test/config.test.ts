/** Settings → daemon command line, environment and initializationOptions; package.json contributions. */
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import { builtinModules } from "node:module";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";

import {
    daemonEnv,
    daemonSettings,
    findExecutable,
    initializationOptions,
    readConfig,
    SETTING_KEYS,
    type SettingKey,
    serveArgs,
} from "../src/config";
import { packageRoot } from "./support/daemon";
import { schema } from "./support/fixtures";

function reader(values: Partial<Record<SettingKey, unknown>>) {
    return (key: SettingKey) => values[key];
}

describe("readConfig", () => {
    it("defaults to ctxd from PATH and the daemon's own window", () => {
        const config = readConfig(reader({}));
        assert.deepEqual(config, {
            serverPath: "ctxd",
            stateDir: undefined,
            logLevel: "info",
            autoCompactWindow: "auto",
            autoCompactEnabled: true,
            idleCompaction: false,
            provider: undefined,
            model: undefined,
            observeClaudeCode: true,
            claudeIdleCompaction: false,
        });
        assert.deepEqual(initializationOptions(config), {
            settings: { autoCompactEnabled: true, idleCompaction: false },
        });
        assert.deepEqual(serveArgs(config), ["serve", "--log-stderr"]);
        assert.deepEqual(daemonEnv(config), { CTXD_LOG: "info" });
    });

    it("passes every setting on to the daemon", () => {
        const config = readConfig(
            reader({
                path: "~/bin/ctxd",
                stateDir: "/var/ctxd",
                logLevel: "debug",
                autoCompactWindow: 200_000,
                autoCompactEnabled: false,
                idleCompaction: true,
                provider: "anthropic",
                model: "claude-haiku-4-5",
                claudeIdleCompaction: true,
            }),
        );
        assert.equal(config.serverPath, path.join(os.homedir(), "bin/ctxd"));
        assert.deepEqual(initializationOptions(config), {
            stateDir: "/var/ctxd",
            settings: {
                autoCompactEnabled: false,
                idleCompaction: true,
                autoCompactWindow: 200_000,
                provider: "anthropic",
                model: "claude-haiku-4-5",
                claudeIdleCompaction: true,
            },
        });
        assert.deepEqual(serveArgs(config), ["serve", "--log-stderr", "--state-dir", "/var/ctxd"]);
        assert.deepEqual(daemonEnv(config), { CTXD_LOG: "debug" });
    });

    it("ignores values of the wrong type", () => {
        const config = readConfig(
            reader({ path: "  ", logLevel: "loud", autoCompactWindow: "huge", provider: "acme" }),
        );
        assert.equal(config.serverPath, "ctxd");
        assert.equal(config.logLevel, "info");
        assert.equal(daemonSettings(config).autoCompactWindow, undefined);
        assert.equal(daemonSettings(config).provider, undefined);
    });

    it("sends the daemon only keys of its settings schema (the log level goes in CTXD_LOG)", () => {
        const settingsSchema = schema("settings");
        const known = Object.keys(settingsSchema.properties);
        const config = readConfig(
            reader({
                autoCompactWindow: 300_000,
                autoCompactEnabled: false,
                idleCompaction: true,
                provider: "offline",
                model: "m",
                logLevel: "trace",
                claudeIdleCompaction: true,
            }),
        );
        const sent = daemonSettings(config);
        for (const key of Object.keys(sent)) {
            assert.ok(known.includes(key), `settings key ${key} is in schemas/settings.json`);
        }
        assert.equal("logLevel" in sent, false);
        const providers = (settingsSchema.$defs?.ProviderKind as unknown as { enum: string[] })
            .enum;
        assert.ok(providers.includes(sent.provider as string));
        const manifest = JSON.parse(
            fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"),
        );
        assert.deepEqual(manifest.contributes.configuration.properties["ctxd.provider"].enum, [
            "",
            ...providers,
        ]);
    });
});

describe("findExecutable", () => {
    it("finds a command on the search path, and checks a path as given", () => {
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-find-"));
        const exe = path.join(dir, "ctxd");
        fs.writeFileSync(exe, "#!/bin/sh\n", { mode: 0o755 });
        fs.writeFileSync(path.join(dir, "plain"), "", { mode: 0o644 });
        assert.equal(findExecutable("ctxd", `/nonexistent${path.delimiter}${dir}`), exe);
        assert.equal(findExecutable(exe, ""), exe);
        assert.equal(findExecutable("plain", dir), undefined);
        assert.equal(findExecutable(path.join(dir, "missing"), ""), undefined);
    });
});

describe("package.json", () => {
    const manifest = JSON.parse(fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"));

    it("contributes every setting, each with a description", () => {
        const properties: Record<string, { markdownDescription?: string; description?: string }> =
            manifest.contributes.configuration.properties;
        // `ctxd.trace.server` is read by vscode-languageclient itself (the client's id is `ctxd`).
        assert.deepEqual(
            Object.keys(properties).sort(),
            [...SETTING_KEYS.map((k) => `ctxd.${k}`), "ctxd.trace.server"].sort(),
        );
        for (const [key, property] of Object.entries(properties)) {
            assert.ok(
                (property.markdownDescription ?? property.description ?? "").length > 20,
                `${key} has a description`,
            );
        }
    });

    it("lets user settings choose the executable, in local and remote windows", () => {
        // `machine` and `machine-overridable` settings are read from the remote machine's
        // settings only, and hidden from the User tab there: a user-level ctxd.path was ignored.
        const properties: Record<string, { scope?: string; restricted?: boolean }> =
            manifest.contributes.configuration.properties;
        for (const key of ["ctxd.path", "ctxd.stateDir"]) {
            assert.equal(properties[key].scope, "window", key);
            assert.equal(
                properties[key].restricted,
                true,
                `${key}: not taken from an untrusted workspace`,
            );
        }
        assert.deepEqual(
            (
                manifest.contributes.configuration.properties["ctxd.trace.server"] as {
                    enum: string[];
                }
            ).enum,
            ["off", "messages", "verbose"],
        );
    });

    it("activates at start-up and runs from a self-contained bundle", () => {
        assert.deepEqual(manifest.activationEvents, ["onStartupFinished"]);
        assert.equal(manifest.main, "./dist/extension.js");
        const bundle = fs.readFileSync(path.join(packageRoot, manifest.main), "utf8");
        // Only `vscode` (given by the editor) and Node's own modules are left to require().
        const required = [...bundle.matchAll(/require\("([^"]+)"\)/g)].map((m) => m[1]);
        const outside = required.filter(
            (m) => m !== "vscode" && !m.startsWith("node:") && !builtinModules.includes(m),
        );
        assert.deepEqual([...new Set(outside)], [], "every dependency is bundled");
        assert.ok(required.includes("vscode"));
    });
});
