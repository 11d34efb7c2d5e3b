/**
 * The sessions this editor opened on ctxd, and the API other extensions call.
 *
 * `CtxdSessions` is the only place that sends `ctx/` requests. It does not know about
 * `vscode` nor about how the daemon runs: it talks through a `Connection` (the
 * extension adapts its `LanguageClient`, the tests a `vscode-jsonrpc` connection to a
 * real `ctxd`). It remembers each open session's `cwd` and `model` so that after the
 * daemon restarts `reopenAll` can resume them by id. (The daemon would also resume a
 * stored session on its first use by id; reopening at once redraws the status bar from
 * the store without waiting for that use.)
 *
 * **Invariant:** the usage a listener sees is exactly what the daemon sent (from
 * `ctx/usageChanged`, or the `ctx/openSession` / `ctx/clear` answer that starts a
 * session); nothing here computes levels or thresholds.
 */
import { Disposable, Emitter, Event, RequestType } from "vscode-jsonrpc";

import * as ext from "./lsp_ext";

/** What `CtxdSessions` needs from a JSON-RPC connection to the daemon. */
export interface Connection {
    request<R>(method: string, params: unknown): Promise<R>;
    onNotification(method: string, handler: (params: unknown) => void): Disposable;
}

/** One open session as the editor knows it. */
export interface SessionInfo {
    sessionId: string;
    cwd: string;
    model: string;
    /** The latest usage the daemon sent, if any. */
    usage?: ext.Usage;
}

/**
 * The API `activate()` returns, for the host agent extension:
 *
 * ```ts
 * const ctxd = vscode.extensions.getExtension<CtxdApi>("ctxd.ctxd")!.exports;
 * const { sessionId } = await ctxd.openSession({ cwd, model });
 * ctxd.onUsageChanged(({ usage }) => …);
 * await ctxd.append(sessionId, [record]);
 * ```
 */
export interface CtxdApi {
    /** Bumped when a member is renamed or removed. */
    readonly apiVersion: 1;
    openSession(params: ext.OpenSessionParams): Promise<ext.OpenSessionResult>;
    append(sessionId: string, records: ext.TranscriptRecord[]): Promise<ext.AppendResult>;
    assemble(params: ext.AssembleParams): Promise<ext.AssembleResult>;
    /**
     * The session's next model request, whole, for a host that sends it on: the daemon is
     * asked only for what changed since the request this returned last (`since`), and the
     * answer is spliced into that one. The result's `messagesFrom` is 0.
     */
    nextRequest(params: ext.AssembleParams): Promise<ext.AssembleResult>;
    usage(sessionId: string): Promise<ext.Usage>;
    compact(sessionId: string, instructions?: string): Promise<ext.CompactResult>;
    /** Takes back the latest compaction (refused, -33010, once a new turn followed it). */
    undoCompact(sessionId: string): Promise<ext.UndoCompactResult>;
    context(sessionId: string): Promise<ext.ContextResult>;
    /** Saves the window for `model` (`"auto"` clears it); its open sessions follow at once. */
    setAutoCompactWindow(
        model: string,
        window: ext.WindowChoice,
    ): Promise<ext.SetAutoCompactWindowResult>;
    /** Tells the daemon the agent read a file by some means the transcript does not show. */
    fileRead(params: ext.FileReadParams): Promise<ext.FileReadResult>;
    /** Starts a new empty session in place of `sessionId` (which closes); returns the new id. */
    clear(sessionId: string): Promise<string>;
    /**
     * Tells the daemon the host's model request failed; it compacts when that answers the
     * refusal (`action: "compacted"`: retry the request now).
     */
    reportProviderError(
        sessionId: string,
        error: ext.ProviderErrorReport,
    ): Promise<ext.ReportProviderErrorResult>;
    closeSession(sessionId: string): Promise<void>;
    /** Any `ctx/` method, for what this API does not wrap yet. */
    request<R = unknown>(method: string, params: unknown): Promise<R>;
    /** Open sessions with their latest usage. */
    sessions(): SessionInfo[];
    readonly onUsageChanged: Event<ext.UsageChangedNotification>;
    readonly onCompacted: Event<ext.CompactedNotification>;
    readonly onCompactFailed: Event<ext.CompactFailedNotification>;
    readonly onContextChanged: Event<ext.ContextChangedNotification>;
    /** A session was opened, cleared into a new id, or closed. */
    readonly onSessionsChanged: Event<void>;
}

export class CtxdSessions implements CtxdApi {
    readonly apiVersion = 1 as const;

    private readonly open = new Map<string, SessionInfo>();
    /** Per session, the request `nextRequest` returned last and its revision. */
    private readonly held = new Map<string, { revision: string; messages: unknown[] }>();
    private connection: Connection | undefined;
    private subscriptions: Disposable[] = [];
    /** Settles when `reopenAll` is done; requests wait for it so none meets "not open". */
    private reopened: Promise<void> = Promise.resolve();

    private readonly usageEmitter = new Emitter<ext.UsageChangedNotification>();
    private readonly compactedEmitter = new Emitter<ext.CompactedNotification>();
    private readonly compactFailedEmitter = new Emitter<ext.CompactFailedNotification>();
    private readonly contextChangedEmitter = new Emitter<ext.ContextChangedNotification>();
    private readonly sessionsEmitter = new Emitter<void>();

    readonly onUsageChanged = this.usageEmitter.event;
    readonly onCompacted = this.compactedEmitter.event;
    readonly onCompactFailed = this.compactFailedEmitter.event;
    readonly onContextChanged = this.contextChangedEmitter.event;
    readonly onSessionsChanged = this.sessionsEmitter.event;

    /** Routes the daemon's notifications from `connection` to this object's events. */
    attach(connection: Connection): void {
        this.detach();
        this.connection = connection;
        const on = <P>(type: { method: string }, handler: (params: P) => void) =>
            this.subscriptions.push(
                connection.onNotification(type.method, (params) => handler(params as P)),
            );
        on<ext.UsageChangedNotification>(ext.usageChanged, (p) =>
            this.setUsage(p.sessionId, p.usage),
        );
        on<ext.CompactedNotification>(ext.compacted, (p) => {
            this.compactedEmitter.fire(p);
        });
        on<ext.CompactFailedNotification>(ext.compactFailed, (p) => {
            this.compactFailedEmitter.fire(p);
        });
        on<ext.ContextChangedNotification>(ext.contextChanged, (p) => {
            this.contextChangedEmitter.fire(p);
        });
    }

    detach(): void {
        for (const s of this.subscriptions) {
            s.dispose();
        }
        this.subscriptions = [];
        this.connection = undefined;
    }

    /** Resumes every session this editor had open (after the daemon restarted). */
    reopenAll(): Promise<void> {
        const connection = this.connection;
        if (connection === undefined) {
            return Promise.resolve();
        }
        const reopen = [...this.open.values()].map((s) =>
            connection
                .request<ext.OpenSessionResult>(ext.openSession.method, {
                    cwd: s.cwd,
                    model: s.model,
                    sessionId: s.sessionId,
                })
                .then(
                    (result) => this.setUsage(result.sessionId, result.usage),
                    () => undefined,
                ),
        );
        this.reopened = Promise.all(reopen).then(() => undefined);
        return this.reopened;
    }

    sessions(): SessionInfo[] {
        return [...this.open.values()].map((s) => ({ ...s }));
    }

    /** The latest usage of `sessionId` that the daemon sent. */
    latestUsage(sessionId: string): ext.Usage | undefined {
        return this.open.get(sessionId)?.usage;
    }

    async openSession(params: ext.OpenSessionParams): Promise<ext.OpenSessionResult> {
        const result = await this.send(ext.openSession, params);
        const known = this.open.get(result.sessionId);
        this.open.set(result.sessionId, {
            sessionId: result.sessionId,
            cwd: params.cwd,
            model: params.model,
            usage: known?.usage,
        });
        this.sessionsEmitter.fire();
        this.setUsage(result.sessionId, result.usage);
        return result;
    }

    append(sessionId: string, records: ext.TranscriptRecord[]): Promise<ext.AppendResult> {
        return this.send(ext.append, { sessionId, records });
    }

    assemble(params: ext.AssembleParams): Promise<ext.AssembleResult> {
        return this.send(ext.assemble, params);
    }

    async nextRequest(params: ext.AssembleParams): Promise<ext.AssembleResult> {
        const kept = this.held.get(params.sessionId);
        const result = await this.send(
            ext.assemble,
            kept ? { ...params, since: kept.revision } : params,
        );
        const sent = (result.request.messages ?? []) as unknown[];
        let messages = sent;
        if (result.messagesFrom > 0) {
            // The daemon answers `since` only its latest answer, which this kept.
            if (kept === undefined || result.messagesFrom > kept.messages.length) {
                this.held.delete(params.sessionId);
                throw new Error(
                    `ctx/assemble answered from message ${result.messagesFrom} of a request this client does not hold`,
                );
            }
            messages = [...kept.messages.slice(0, result.messagesFrom), ...sent];
        }
        this.held.set(params.sessionId, { revision: result.revision, messages });
        return { ...result, request: { ...result.request, messages }, messagesFrom: 0 };
    }

    async usage(sessionId: string): Promise<ext.Usage> {
        return (await this.send(ext.usage, { sessionId })).usage;
    }

    compact(sessionId: string, instructions?: string): Promise<ext.CompactResult> {
        const params: ext.CompactParams = instructions
            ? { sessionId, instructions }
            : { sessionId };
        return this.send(ext.compact, params);
    }

    undoCompact(sessionId: string): Promise<ext.UndoCompactResult> {
        return this.send(ext.undoCompact, { sessionId });
    }

    context(sessionId: string): Promise<ext.ContextResult> {
        return this.send(ext.context, { sessionId });
    }

    setAutoCompactWindow(
        model: string,
        window: ext.WindowChoice,
    ): Promise<ext.SetAutoCompactWindowResult> {
        return this.send(ext.setAutoCompactWindow, { model, window });
    }

    fileRead(params: ext.FileReadParams): Promise<ext.FileReadResult> {
        return this.send(ext.fileRead, params);
    }

    async clear(sessionId: string): Promise<string> {
        const result = await this.send(ext.clear, { sessionId });
        this.held.delete(sessionId);
        const old = this.open.get(sessionId);
        if (old !== undefined) {
            this.open.delete(sessionId);
            this.open.set(result.sessionId, {
                sessionId: result.sessionId,
                cwd: old.cwd,
                model: old.model,
            });
            this.sessionsEmitter.fire();
            this.setUsage(result.sessionId, result.usage);
        }
        return result.sessionId;
    }

    reportProviderError(
        sessionId: string,
        error: ext.ProviderErrorReport,
    ): Promise<ext.ReportProviderErrorResult> {
        return this.send(ext.reportProviderError, { sessionId, error });
    }

    async closeSession(sessionId: string): Promise<void> {
        try {
            await this.send(ext.closeSession, { sessionId });
        } finally {
            this.held.delete(sessionId);
            if (this.open.delete(sessionId)) {
                this.sessionsEmitter.fire();
            }
        }
    }

    async request<R = unknown>(method: string, params: unknown): Promise<R> {
        await this.reopened;
        if (this.connection === undefined) {
            throw new Error(`ctxd is not running; ${method} was not sent`);
        }
        return this.connection.request<R>(method, params);
    }

    dispose(): void {
        this.detach();
        for (const e of [
            this.usageEmitter,
            this.compactedEmitter,
            this.compactFailedEmitter,
            this.contextChangedEmitter,
        ]) {
            e.dispose();
        }
        this.sessionsEmitter.dispose();
    }

    private send<P, R>(type: RequestType<P, R, void>, params: P): Promise<R> {
        return this.request<R>(type.method, params);
    }

    private setUsage(sessionId: string, usage: ext.Usage): void {
        const session = this.open.get(sessionId);
        if (session !== undefined) {
            // The daemon pushes the opened state as well as answering with it: the same
            // usage twice for a session already drawn is one change.
            if (
                session.usage !== undefined &&
                JSON.stringify(session.usage) === JSON.stringify(usage)
            ) {
                return;
            }
            session.usage = usage;
        }
        this.usageEmitter.fire({ sessionId, usage });
    }
}
