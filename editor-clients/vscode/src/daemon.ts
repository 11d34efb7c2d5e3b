/**
 * Running the daemon: a `LanguageClient` over stdio that starts `ctxd serve`, sends its
 * stderr (the daemon's log) to the output channel, and restarts it with back-off when
 * it dies. The client syncs no documents: ctxd is reached only through `ctx/` methods.
 */
import { spawn } from "node:child_process";

import * as readline from "node:readline";

import * as vscode from "vscode";
import {
    CloseAction,
    DidChangeConfigurationNotification,
    ErrorAction,
    LanguageClient,
    type LanguageClientOptions,
    type ServerOptions,
} from "vscode-languageclient/node";

import { Backoff } from "./backoff";
import { parseLogLine } from "./daemonLog";
import { type CtxdConfig, daemonEnv, daemonSettings, findExecutable, initializationOptions, serveArgs } from "./config";
import type { Connection } from "./sessions";

function sleep(ms: number): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Builds (does not start) the client. `config()` is read again at every (re)start. */
export function createDaemonClient(
    config: () => CtxdConfig,
    output: vscode.LogOutputChannel,
    onExit: () => void = () => undefined,
): LanguageClient {
    const backoff = new Backoff();
    const serverOptions: ServerOptions = async () => {
        const c = config();
        output.appendLine(`[ctxd client] starting ${c.serverPath} ${serveArgs(c).join(" ")}`);
        backoff.started(Date.now());
        const executable = findExecutable(c.serverPath, process.env.PATH ?? "");
        if (executable === undefined) {
            throw new Error(`ctxd not found: "${c.serverPath}" is not an executable file nor on PATH; set ctxd.path`);
        }
        // The client pipes the child's stderr (the daemon's log) into `output`.
        return spawn(executable, serveArgs(c), { env: { ...process.env, ...daemonEnv(c) }, stdio: "pipe" });
    };
    const clientOptions: LanguageClientOptions = {
        documentSelector: [],
        outputChannel: output,
        stdioOptions: {
            // stdout carries the protocol; nothing else is read from it.
            stdout: () => undefined,
            stderr: (input, channel) => {
                readline.createInterface({ input, crlfDelay: Infinity, terminal: false }).on("line", (line) => {
                    const { level, text } = parseLogLine(line);
                    channel[level](text);
                });
            },
        },
        initializationOptions: () => initializationOptions(config()),
        errorHandler: {
            error: () => ({ action: ErrorAction.Continue }),
            closed: async () => {
                onExit();
                const delay = backoff.nextDelay(Date.now());
                output.appendLine(`[ctxd client] ctxd exited; restarting in ${delay} ms`);
                await sleep(delay);
                return { action: CloseAction.Restart, handled: true };
            },
        },
    };
    return new LanguageClient("ctxd", "ctxd", serverOptions, clientOptions);
}

/** The `Connection` that `CtxdSessions` talks through. */
export function clientConnection(client: LanguageClient): Connection {
    return {
        request: <R>(method: string, params: unknown) => client.sendRequest<R>(method, params),
        onNotification: (method, handler) => client.onNotification(method, handler),
    };
}

/** Sends the current settings to a running daemon. */
export async function sendSettings(client: LanguageClient, config: CtxdConfig): Promise<void> {
    if (client.isRunning()) {
        await client.sendNotification(DidChangeConfigurationNotification.type, { settings: daemonSettings(config) });
    }
}
