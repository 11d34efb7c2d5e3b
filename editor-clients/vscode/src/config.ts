/**
 * The extension's settings and what the daemon is given from them: the command line,
 * the environment, and `initializationOptions` (also re-sent with
 * `workspace/didChangeConfiguration` when a setting changes).
 *
 * Pure: it reads through a `get` function, so the tests need no `vscode`.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import type { InitializationOptions, ProviderKind, Settings } from "./lsp_ext";

/** Every setting this extension contributes (`ctxd.<key>` in package.json). */
export const SETTING_KEYS = [
    "path",
    "stateDir",
    "logLevel",
    "autoCompactWindow",
    "autoCompactEnabled",
    "idleCompaction",
    "provider",
    "model",
    "observeClaudeCode",
    "claudeIdleCompaction",
] as const;
export type SettingKey = (typeof SETTING_KEYS)[number];

/** Settings that only take effect when the daemon restarts. */
export const RESTART_KEYS: readonly SettingKey[] = ["path", "stateDir", "logLevel"];

export type LogLevel = "error" | "warn" | "info" | "debug" | "trace";

export interface CtxdConfig {
    /** The daemon executable: the `ctxd.path` setting, else `ctxd` from PATH. */
    serverPath: string;
    stateDir?: string;
    logLevel: LogLevel;
    autoCompactWindow: number | "auto";
    autoCompactEnabled: boolean;
    idleCompaction: boolean;
    provider?: ProviderKind;
    model?: string;
    /** Observe the Claude Code sessions of the workspace folders (default on). */
    observeClaudeCode: boolean;
    /** Let the daemon compact an idle, observed Claude Code session in place (default off). */
    claudeIdleCompaction: boolean;
}

/** Reads one setting (the extension passes `workspace.getConfiguration("ctxd").get`). */
export type SettingReader = (key: SettingKey) => unknown;

function nonEmptyString(value: unknown): string | undefined {
    return typeof value === "string" && value.trim() !== "" ? value.trim() : undefined;
}

/** `~/x` → `$HOME/x`; other paths unchanged. */
export function expandHome(p: string): string {
    if (p === "~") {
        return os.homedir();
    }
    if (p.startsWith("~/")) {
        return path.join(os.homedir(), p.slice(2));
    }
    return p;
}

const LOG_LEVELS: readonly LogLevel[] = ["error", "warn", "info", "debug", "trace"];
const PROVIDERS: readonly ProviderKind[] = ["anthropic", "openai", "offline"];

export function readConfig(get: SettingReader): CtxdConfig {
    const serverPath = nonEmptyString(get("path"));
    const stateDir = nonEmptyString(get("stateDir"));
    const logLevel = get("logLevel");
    const window = get("autoCompactWindow");
    const provider = nonEmptyString(get("provider"));
    return {
        serverPath: serverPath !== undefined ? expandHome(serverPath) : "ctxd",
        stateDir: stateDir !== undefined ? expandHome(stateDir) : undefined,
        logLevel: LOG_LEVELS.includes(logLevel as LogLevel) ? (logLevel as LogLevel) : "info",
        autoCompactWindow: typeof window === "number" && window > 0 ? Math.trunc(window) : "auto",
        autoCompactEnabled: get("autoCompactEnabled") !== false,
        idleCompaction: get("idleCompaction") === true,
        provider: PROVIDERS.includes(provider as ProviderKind)
            ? (provider as ProviderKind)
            : undefined,
        model: nonEmptyString(get("model")),
        observeClaudeCode: get("observeClaudeCode") !== false,
        claudeIdleCompaction: get("claudeIdleCompaction") === true,
    };
}

/**
 * The daemon's `settings` (keys of a ctxd settings file, `schemas/settings.json`; the
 * daemon reports any other key as unknown). `autoCompactWindow` is left out when it is
 * `auto`, so the daemon's own resolution applies. The log level is not a setting: it
 * reaches the daemon as `CTXD_LOG` (see `daemonEnv`).
 */
export function daemonSettings(config: CtxdConfig): Settings {
    const settings: Settings = {
        autoCompactEnabled: config.autoCompactEnabled,
        idleCompaction: config.idleCompaction,
    };
    if (config.autoCompactWindow !== "auto") {
        settings.autoCompactWindow = config.autoCompactWindow;
    }
    if (config.provider !== undefined) {
        settings.provider = config.provider;
    }
    if (config.model !== undefined) {
        settings.model = config.model;
    }
    // Only when switched on: off is the daemon's default, and a user's settings file
    // may switch it on for everyone.
    if (config.claudeIdleCompaction) {
        settings.claudeIdleCompaction = true;
    }
    return settings;
}

export function initializationOptions(config: CtxdConfig): InitializationOptions {
    const options: InitializationOptions = { settings: daemonSettings(config) };
    if (config.stateDir !== undefined) {
        options.stateDir = config.stateDir;
    }
    return options;
}

/** `ctxd serve` arguments. Logs go to stderr, which the extension shows as its log. */
export function serveArgs(config: CtxdConfig): string[] {
    const args = ["serve", "--log-stderr"];
    if (config.stateDir !== undefined) {
        args.push("--state-dir", config.stateDir);
    }
    return args;
}

/** Variables added to the daemon's environment. */
export function daemonEnv(config: CtxdConfig): Record<string, string> {
    return { CTXD_LOG: config.logLevel };
}

function isExecutableFile(file: string): boolean {
    try {
        fs.accessSync(file, fs.constants.X_OK);
        return fs.statSync(file).isFile();
    } catch {
        return false;
    }
}

/** The file `command` runs: itself when it names a path, else the first match on `searchPath`. */
export function findExecutable(command: string, searchPath: string): string | undefined {
    if (command.includes(path.sep)) {
        return isExecutableFile(command) ? command : undefined;
    }
    for (const dir of searchPath.split(path.delimiter)) {
        if (dir !== "") {
            const candidate = path.join(dir, command);
            if (isExecutableFile(candidate)) {
                return candidate;
            }
        }
    }
    return undefined;
}
