/**
 * The real `ctxd` binary for tests: spawned over stdio, spoken to through
 * `vscode-jsonrpc/node`, with the LSP handshake done. `CTXD_BIN` names the binary;
 * by default it is `target/debug/ctxd` of this checkout.
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import {
    createMessageConnection,
    type MessageConnection,
    StreamMessageReader,
    StreamMessageWriter,
} from "vscode-jsonrpc/node";

import type { CtxdCapabilities, InitializationOptions } from "../../src/lsp_ext";
import type { Connection } from "../../src/sessions";

/** `editor-clients/vscode`, from `out/test/support`. */
export const packageRoot = path.resolve(__dirname, "../../..");

export function ctxdBin(): string {
    return process.env.CTXD_BIN ?? path.resolve(packageRoot, "../../target/debug/ctxd");
}

/**
 * The daemon settings of the tests: a 100,000-token window (levels the tests reach with
 * a few records), and the offline summarizer, so that a compaction never reaches a
 * provider whatever the environment (`ANTHROPIC_API_KEY`).
 */
export const TEST_SETTINGS = { autoCompactWindow: 100_000, provider: "offline" } as const;

/**
 * A working directory with no memory files and no git repository: a session opened in
 * it starts at 0 tokens (the base context of a real project counts from the start).
 */
export const EMPTY_CWD = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-empty-cwd-")));

export function tempStateDir(): string {
    return fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-vscode-test-"));
}

export interface TestDaemon {
    process: ChildProcessWithoutNullStreams;
    rpc: MessageConnection;
    /** The `Connection` `CtxdSessions` uses. */
    connection: Connection;
    capabilities: CtxdCapabilities;
    stateDir: string;
    /** `shutdown` + `exit`, then waits for the process to end. */
    stop(): Promise<void>;
    /** SIGKILL, as a crash would; waits for the process to end. */
    kill(): Promise<void>;
}

export async function startDaemon(
    stateDir: string,
    options: InitializationOptions = {},
): Promise<TestDaemon> {
    const child = spawn(
        ctxdBin(),
        ["serve", "--state-dir", stateDir, "--log-file", path.join(stateDir, "test.log")],
        {
            stdio: "pipe",
        },
    );
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    const rpc = createMessageConnection(
        new StreamMessageReader(child.stdout),
        new StreamMessageWriter(child.stdin),
    );
    rpc.listen();
    const init = await rpc.sendRequest<{
        capabilities: { experimental: { ctxd: CtxdCapabilities } };
    }>("initialize", {
        processId: process.pid,
        rootUri: null,
        capabilities: {},
        initializationOptions: { stateDir, ...options },
    });
    await rpc.sendNotification("initialized", {});
    const connection: Connection = {
        request: <R>(method: string, params: unknown) => rpc.sendRequest<R>(method, params),
        onNotification: (method, handler) => rpc.onNotification(method, handler),
    };
    return {
        process: child,
        rpc,
        connection,
        capabilities: init.capabilities.experimental.ctxd,
        stateDir,
        async stop() {
            if (child.exitCode === null && child.signalCode === null) {
                await rpc.sendRequest("shutdown");
                await rpc.sendNotification("exit");
                await exited;
            }
            rpc.dispose();
        },
        async kill() {
            child.kill("SIGKILL");
            await exited;
            rpc.dispose();
        },
    };
}
