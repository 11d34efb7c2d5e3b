/**
 * Running the daemon: a `LanguageClient` over stdio that starts `ctxd serve`, sends its
 * stderr (the daemon's log) to the output channel, and restarts it with back-off when
 * it dies. The client syncs no documents: ctxd is reached only through `ctx/` methods.
 *
 * `DaemonController` owns the client. A restart (the command, or a fixed `ctxd.path`)
 * builds a fresh `LanguageClient` whatever state the old one is in: a client whose start
 * failed cannot be stopped nor started again, so it is left alone and its process, if
 * any, is killed. Every state change, with the cause of a failure, goes to listeners.
 */
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as readline from "node:readline";

import * as vscode from "vscode";
import {
    CloseAction,
    DidChangeConfigurationNotification,
    ErrorAction,
    LanguageClient,
    type LanguageClientOptions,
    type ServerOptions,
    State,
} from "vscode-languageclient/node";

import { Backoff } from "./backoff";
import { type CtxdConfig, daemonEnv, daemonSettings, findExecutable, initializationOptions, serveArgs } from "./config";
import { parseLogLine } from "./daemonLog";
import type { Connection } from "./sessions";

function sleep(ms: number): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, ms));
}

/** What the daemon is doing, as the status item shows it. */
export type DaemonState =
    | { kind: "starting" }
    | { kind: "ready" }
    | { kind: "restarting"; at: number }
    | { kind: "failed"; reason: string; fix: "path" | "restart" };

/** How many of the daemon's last stderr lines a failure message quotes. */
const STDERR_LINES = 5;

/** How long a retired daemon has to exit after `exit` (then after SIGKILL). */
const RETIRE_GRACE_MS = 3000;

/** Resolves true once `child` has exited, false after `ms` if it has not. */
function processExit(child: ChildProcess, ms: number): Promise<boolean> {
    if (child.exitCode !== null || child.signalCode !== null) {
        return Promise.resolve(true);
    }
    return new Promise((resolve) => {
        const timer = setTimeout(() => resolve(false), ms);
        child.once("exit", () => {
            clearTimeout(timer);
            resolve(true);
        });
    });
}

/**
 * Why `command` cannot be started, or undefined when it can: a missing file, a file that
 * is not executable, or a bare name not found on `PATH`.
 */
export function executableProblem(command: string, searchPath: string): string | undefined {
    if (findExecutable(command, searchPath) !== undefined) {
        return undefined;
    }
    if (command.includes("/")) {
        if (!fs.existsSync(command)) {
            return `not found: ${command} does not exist`;
        }
        if (fs.statSync(command).isDirectory()) {
            return `not found: ${command} is a directory`;
        }
        return `not executable: ${command} (chmod +x it, or set ctxd.path to the binary)`;
    }
    return `not found: "${command}" is not on PATH; set ctxd.path`;
}

export class DaemonController implements vscode.Disposable {
    private client: LanguageClient | undefined;
    private child: ChildProcess | undefined;
    private readonly stderrTail: string[] = [];
    private exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    private current: DaemonState = { kind: "starting" };
    private readonly listeners: ((state: DaemonState) => void)[] = [];
    private readonly backoff = new Backoff();
    /** Bumped by each restart: callbacks of an older client are ignored. */
    private generation = 0;
    private disposed = false;
    /** Whether the current client reached Running once (a crash after that restarts it). */
    private ran = false;
    /** Why the executable could not be started at the latest attempt, if that was why. */
    private startError: string | undefined;

    constructor(
        private readonly config: () => CtxdConfig,
        private readonly output: vscode.LogOutputChannel,
        /** Called with each new client's connection before it starts. */
        private readonly attach: (connection: Connection) => void,
    ) {}

    get state(): DaemonState {
        return this.current;
    }

    onDidChangeState(listener: (state: DaemonState) => void): vscode.Disposable {
        this.listeners.push(listener);
        return { dispose: () => this.listeners.splice(this.listeners.indexOf(listener) >>> 0, 1) };
    }

    /** The running client, if the daemon is up. */
    running(): LanguageClient | undefined {
        return this.client?.isRunning() ? this.client : undefined;
    }

    /** Starts a fresh client (from any state); resolves once it is running or has failed. */
    async start(): Promise<void> {
        const generation = ++this.generation;
        await this.retire();
        if (this.disposed || generation !== this.generation) {
            return;
        }
        this.setState({ kind: "starting" });
        const problem = executableProblem(this.config().serverPath, process.env.PATH ?? "");
        if (problem !== undefined) {
            this.output.appendLine(`[ctxd client] ${problem}`);
            this.setState({ kind: "failed", reason: problem, fix: "path" });
            return;
        }
        this.ran = false;
        const client = this.createClient(generation);
        this.client = client;
        this.attach({
            request: <R>(method: string, params: unknown) => client.sendRequest<R>(method, params),
            onNotification: (method, handler) => client.onNotification(method, handler),
        });
        client.onDidChangeState(({ newState }) => {
            if (generation !== this.generation) {
                return;
            }
            if (newState === State.Running) {
                this.ran = true;
                this.setState({ kind: "ready" });
            } else if (newState === State.StartFailed && this.ran) {
                // A restart after a crash failed (the first start's failure is `start`'s to
                // report): the client is done, the user restarts it.
                void this.exited(1000).then(() => {
                    if (generation === this.generation) {
                        const reason = this.startError ?? this.failureReason(new Error("the daemon could not be restarted"));
                        this.output.appendLine(`[ctxd client] restart failed: ${reason}`);
                        this.setState({ kind: "failed", reason, fix: this.startError !== undefined ? "path" : "restart" });
                    }
                });
            }
        });
        try {
            await client.start();
        } catch (error) {
            if (generation !== this.generation) {
                return;
            }
            await this.exited(1000);
            const reason = this.failureReason(error);
            this.output.appendLine(`[ctxd client] start failed: ${reason}`);
            this.setState({ kind: "failed", reason, fix: "restart" });
        }
    }

    /** Same as `start`: named for the command. */
    restart(): Promise<void> {
        this.output.appendLine("[ctxd client] restart requested");
        return this.start();
    }

    async dispose(): Promise<void> {
        this.disposed = true;
        this.generation++;
        await this.retire();
    }

    /** Stops the current client if it runs, or abandons it; kills its process either way. */
    private async retire(): Promise<void> {
        const client = this.client;
        const child = this.child;
        this.client = undefined;
        this.child = undefined;
        if (client !== undefined && client.state === State.Running) {
            try {
                await client.stop(2000);
            } catch (error) {
                this.output.appendLine(`[ctxd client] stopping the old client: ${String(error)}`);
            }
        }
        if (child !== undefined && child.exitCode === null && child.signalCode === null) {
            // `stop` resolves once `exit` is sent, not when the process ends: the next
            // daemon would find the store still locked by this one and refuse to start.
            if (!(await processExit(child, RETIRE_GRACE_MS))) {
                child.kill("SIGKILL");
                await processExit(child, RETIRE_GRACE_MS);
            }
        }
    }

    private createClient(generation: number): LanguageClient {
        const serverOptions: ServerOptions = async () => {
            const c = this.config();
            this.output.appendLine(`[ctxd client] starting ${c.serverPath} ${serveArgs(c).join(" ")}`);
            this.backoff.started(Date.now());
            const executable = findExecutable(c.serverPath, process.env.PATH ?? "");
            if (executable === undefined) {
                this.startError = executableProblem(c.serverPath, process.env.PATH ?? "") ?? `not found: ${c.serverPath}`;
                throw new Error(this.startError);
            }
            this.startError = undefined;
            this.stderrTail.length = 0;
            this.exit = undefined;
            const child = spawn(executable, serveArgs(c), { env: { ...process.env, ...daemonEnv(c) }, stdio: "pipe" });
            child.on("exit", (code, signal) => {
                if (generation === this.generation) {
                    this.exit = { code, signal };
                }
            });
            if (generation === this.generation) {
                this.child = child;
            }
            return child;
        };
        const clientOptions: LanguageClientOptions = {
            documentSelector: [],
            outputChannel: this.output,
            stdioOptions: {
                // stdout carries the protocol; nothing else is read from it.
                stdout: () => undefined,
                stderr: (input, channel) => {
                    readline.createInterface({ input, crlfDelay: Infinity, terminal: false }).on("line", (line) => {
                        const { level, text } = parseLogLine(line);
                        channel[level](text);
                        this.stderrTail.push(line);
                        if (this.stderrTail.length > STDERR_LINES) {
                            this.stderrTail.shift();
                        }
                    });
                },
            },
            initializationOptions: () => initializationOptions(this.config()),
            errorHandler: {
                error: () => ({ action: ErrorAction.Continue }),
                closed: async () => {
                    if (generation !== this.generation || this.disposed || !this.ran) {
                        // A start that failed is reported by `start`, and restarted by the user.
                        return { action: CloseAction.DoNotRestart, handled: true };
                    }
                    const delay = this.backoff.nextDelay(Date.now());
                    this.output.appendLine(`[ctxd client] ctxd exited${this.exitText()}; restarting in ${delay} ms`);
                    this.setState({ kind: "restarting", at: Date.now() + delay });
                    await sleep(delay);
                    if (generation !== this.generation || this.disposed) {
                        return { action: CloseAction.DoNotRestart, handled: true };
                    }
                    this.setState({ kind: "starting" });
                    return { action: CloseAction.Restart, handled: true };
                },
            },
        };
        return new LanguageClient("ctxd", "ctxd", serverOptions, clientOptions);
    }

    /** Waits up to `ms` for the current process to exit (a failed start's exit status). */
    private async exited(ms: number): Promise<void> {
        if (this.child !== undefined && (await processExit(this.child, ms))) {
            // The stderr lines before the exit are still being read.
            await new Promise((resolve) => setImmediate(resolve));
        }
    }

    private exitText(): string {
        if (this.exit === undefined) {
            return "";
        }
        return this.exit.code !== null ? ` with code ${this.exit.code}` : ` on signal ${this.exit.signal}`;
    }

    /** The cause of a failed start, in one message: the error, the exit and the last stderr lines. */
    private failureReason(error: unknown): string {
        const message = error instanceof Error ? error.message : String(error);
        if (this.exit !== undefined || this.stderrTail.length > 0) {
            const exit = this.exit !== undefined ? `exited${this.exitText()}` : message;
            const tail = this.stderrTail.length > 0 ? `: ${this.stderrTail.join(" | ")}` : "";
            return `${exit}${tail}`;
        }
        return message;
    }

    private setState(state: DaemonState): void {
        this.current = state;
        for (const l of [...this.listeners]) {
            l(state);
        }
    }
}

/**
 * Sends the current settings to a running daemon. A daemon that stops meanwhile gets them
 * at its next start (`initializationOptions`), so a failure here is not reported.
 */
export async function sendSettings(client: LanguageClient | undefined, config: CtxdConfig): Promise<void> {
    if (client?.isRunning()) {
        try {
            await client.sendNotification(DidChangeConfigurationNotification.type, { settings: daemonSettings(config) });
        } catch {
            // Stopped or restarting: initializationOptions carry the settings next time.
        }
    }
}
