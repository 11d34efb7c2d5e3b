/**
 * Running the daemon: a `LanguageClient` over stdio that starts `ctxd serve`, sends its
 * stderr (the daemon's log) to the output channel, and restarts it with back-off when
 * it dies. The client syncs no documents: ctxd is reached only through `ctx/` methods.
 *
 * `DaemonController` owns the client. Every start (the first, a restart after a crash, a
 * retry after a failed start, the Restart command, a fixed `ctxd.path`) builds a fresh
 * `LanguageClient` whatever state the old one is in: a client whose start failed cannot
 * be stopped nor started again, so it is left alone and its process, if any, is killed.
 * The retries are the controller's own, with back-off, and every state change, with the
 * cause of a failure and the time of the next try, goes to listeners. The language
 * client's own messages (raw transport errors, "will not be restarted") never reach the
 * user: its notifications are off and its log lines go to the log at debug level.
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
    RevealOutputChannelOn,
    type ServerOptions,
    State,
} from "vscode-languageclient/node";

import { Backoff } from "./backoff";
import {
    type CtxdConfig,
    daemonEnv,
    daemonSettings,
    findExecutable,
    initializationOptions,
    serveArgs,
} from "./config";
import { parseLogLine } from "./daemonLog";
import type { Connection } from "./sessions";

/**
 * What the daemon is doing, as the status item shows it. `restarting`: it exited after
 * running (`reason`), the next start is at `at`; `failed`: it could not start, and is
 * tried again at `retryAt` (each failure waits longer).
 */
export type DaemonState =
    | { kind: "starting" }
    | { kind: "ready" }
    | { kind: "restarting"; at: number; reason: string }
    | { kind: "failed"; reason: string; fix: "path" | "restart"; retryAt: number };

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
    /** The next start after a crash or a failed start. */
    private retry: NodeJS.Timeout | undefined;
    /** The log the language client writes to: its own lines at debug level. */
    private readonly libraryLog: vscode.LogOutputChannel;

    constructor(
        private readonly config: () => CtxdConfig,
        private readonly output: vscode.LogOutputChannel,
        /** Called with each new client's connection before it starts. */
        private readonly attach: (connection: Connection) => void,
    ) {
        this.libraryLog = quietLog(output);
    }

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
        this.cancelRetry();
        await this.retire();
        if (this.disposed || generation !== this.generation) {
            return;
        }
        this.setState({ kind: "starting" });
        const problem = executableProblem(this.config().serverPath, process.env.PATH ?? "");
        if (problem !== undefined) {
            this.failed(generation, problem, "path");
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
            if (generation === this.generation && newState === State.Running) {
                this.ran = true;
                this.setState({ kind: "ready" });
            }
        });
        try {
            await client.start();
        } catch (error) {
            if (generation !== this.generation) {
                return;
            }
            await this.exited(1000);
            this.failed(
                generation,
                this.startError ?? this.failureReason(error),
                this.startError !== undefined ? "path" : "restart",
            );
        }
    }

    /**
     * The user's restart (the command, the fix of a failed start, a new `ctxd.path`): at
     * once, and the back-off starts over.
     */
    restart(): Promise<void> {
        this.output.appendLine("[ctxd client] restart requested");
        this.backoff.reset();
        return this.start();
    }

    async dispose(): Promise<void> {
        this.disposed = true;
        this.generation++;
        this.cancelRetry();
        await this.retire();
    }

    /** A start failed: said, and tried again after the back-off. */
    private failed(generation: number, reason: string, fix: "path" | "restart"): void {
        const delay = this.backoff.nextDelay(Date.now());
        this.output.appendLine(
            `[ctxd client] start failed: ${reason}; trying again in ${seconds(delay)}`,
        );
        this.setState({ kind: "failed", reason, fix, retryAt: Date.now() + delay });
        this.startAfter(generation, delay);
    }

    /** The daemon exited after it ran: restarted after the back-off. */
    private async crashed(generation: number): Promise<void> {
        await this.exited(1000);
        if (generation !== this.generation || this.disposed) {
            return;
        }
        const delay = this.backoff.nextDelay(Date.now());
        const reason = `ctxd exited${this.exitText()}`;
        this.output.appendLine(`[ctxd client] ${reason}; restarting in ${seconds(delay)}`);
        this.setState({ kind: "restarting", at: Date.now() + delay, reason });
        this.startAfter(generation, delay);
    }

    private startAfter(generation: number, delay: number): void {
        this.cancelRetry();
        this.retry = setTimeout(() => {
            this.retry = undefined;
            if (generation === this.generation && !this.disposed) {
                void this.start();
            }
        }, delay);
    }

    private cancelRetry(): void {
        if (this.retry !== undefined) {
            clearTimeout(this.retry);
            this.retry = undefined;
        }
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
        // async: a missing executable becomes the rejected promise the client expects.
        // eslint-disable-next-line @typescript-eslint/require-await
        const serverOptions: ServerOptions = async () => {
            const c = this.config();
            this.output.appendLine(
                `[ctxd client] starting ${c.serverPath} ${serveArgs(c).join(" ")}`,
            );
            this.backoff.started(Date.now());
            const executable = findExecutable(c.serverPath, process.env.PATH ?? "");
            if (executable === undefined) {
                this.startError =
                    executableProblem(c.serverPath, process.env.PATH ?? "") ??
                    `not found: ${c.serverPath}`;
                throw new Error(this.startError);
            }
            this.startError = undefined;
            this.stderrTail.length = 0;
            this.exit = undefined;
            const child = spawn(executable, serveArgs(c), {
                env: { ...process.env, ...daemonEnv(c) },
                stdio: "pipe",
            });
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
            outputChannel: this.libraryLog,
            // Failures reach the user through the status item and one notification of
            // the extension's own, never as the client's raw toasts.
            revealOutputChannelOn: RevealOutputChannelOn.Never,
            initializationFailedHandler: () => false,
            stdioOptions: {
                // stdout carries the protocol; nothing else is read from it.
                stdout: () => undefined,
                stderr: (input) => {
                    readline
                        .createInterface({ input, crlfDelay: Infinity, terminal: false })
                        .on("line", (line) => {
                            const { level, text } = parseLogLine(line);
                            this.output[level](text);
                            this.stderrTail.push(line);
                            if (this.stderrTail.length > STDERR_LINES) {
                                this.stderrTail.shift();
                            }
                        });
                },
            },
            initializationOptions: () => initializationOptions(this.config()),
            errorHandler: {
                // A write to a daemon that exited (EPIPE): its close follows, and is handled there.
                error: () => ({ action: ErrorAction.Continue, handled: true }),
                closed: () => {
                    // A start that failed is `start`'s to report; a daemon that ran and
                    // exited is restarted by the controller with a fresh client.
                    if (generation === this.generation && !this.disposed && this.ran) {
                        void this.crashed(generation);
                    }
                    return { action: CloseAction.DoNotRestart, handled: true };
                },
            },
        };
        return new QuietLanguageClient("ctxd", "ctxd", serverOptions, clientOptions);
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
        return this.exit.code !== null
            ? ` with code ${this.exit.code}`
            : ` on signal ${this.exit.signal}`;
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
 * A `LanguageClient` that never shows a notification of its own: some of its errors
 * ("couldn't create connection to server … Code: -32099") are shown whatever
 * `revealOutputChannelOn` says. They are logged, and the controller reports the failure.
 */
class QuietLanguageClient extends LanguageClient {
    override error(message: string, data?: unknown): void {
        super.error(message, data, false);
    }

    override warn(message: string, data?: unknown): void {
        super.warn(message, data, false);
    }
}

function seconds(ms: number): string {
    return `${Math.ceil(ms / 1000)} s`;
}

/**
 * The log the language client writes to: the extension's own, with the client's error
 * and warning lines at debug level. The controller says in plain words what happened
 * (start failed, exited, restarting); the client's own lines ("Connection to server got
 * closed. Server will not be restarted.", "Stopping server failed" with a stack) speak
 * of a restart policy that is not the one in force.
 */
function quietLog(output: vscode.LogOutputChannel): vscode.LogOutputChannel {
    return new Proxy(output, {
        get(target, property, receiver) {
            if (property === "error" || property === "warn") {
                return (message: string | Error, ...rest: unknown[]) =>
                    target.debug(
                        `[language client] ${message instanceof Error ? message.message : message}`,
                        ...rest,
                    );
            }
            const value: unknown = Reflect.get(target, property, receiver);
            return typeof value === "function"
                ? (value as (...args: unknown[]) => unknown).bind(target)
                : value;
        },
    });
}

/**
 * Sends the current settings to a running daemon. A daemon that stops meanwhile gets them
 * at its next start (`initializationOptions`), so a failure here is not reported.
 */
export async function sendSettings(
    client: LanguageClient | undefined,
    config: CtxdConfig,
): Promise<void> {
    if (client?.isRunning()) {
        try {
            await client.sendNotification(DidChangeConfigurationNotification.type, {
                settings: daemonSettings(config),
            });
        } catch {
            // Stopped or restarting: initializationOptions carry the settings next time.
        }
    }
}
