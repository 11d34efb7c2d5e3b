/**
 * Entry point: wires the daemon client, the sessions API, the observed Claude Code
 * sessions, the status items, the context view and the commands together, and returns
 * the API other extensions use.
 */
import * as vscode from "vscode";

import { ObservedSessions } from "./claude";
import { registerCommands, reportCompactions } from "./commands";
import { RESTART_KEYS, readConfig, type SettingKey } from "./config";
import { CONTEXT_SCHEME, ContextView } from "./contextView";
import { DaemonController, type DaemonState, sendSettings } from "./daemon";
import { DaemonStatusItem } from "./daemonStatus";
import { CtxdSessions, type CtxdApi } from "./sessions";
import { SessionStatusBar } from "./statusBar";

export type { CtxdApi } from "./sessions";

function currentConfig() {
    const section = vscode.workspace.getConfiguration("ctxd");
    return readConfig((key: SettingKey) => section.get(key));
}

function workspaceFolders(): string[] {
    return (vscode.workspace.workspaceFolders ?? [])
        .filter((f) => f.uri.scheme === "file")
        .map((f) => f.uri.fsPath);
}

export async function activate(context: vscode.ExtensionContext): Promise<CtxdApi> {
    const output = vscode.window.createOutputChannel("ctxd", { log: true });
    const sessions = new CtxdSessions();
    const observed = new ObservedSessions(
        {
            request: (method, params) => sessions.request(method, params),
            onUsageChanged: (l) => sessions.onUsageChanged(l),
        },
        undefined,
        (line) => output.appendLine(line),
    );
    const statusBar = new SessionStatusBar(sessions);
    const status = new DaemonStatusItem(sessions, observed);
    const daemon = new DaemonController(currentConfig, output, (connection) =>
        sessions.attach(connection),
    );
    const contextView = new ContextView(sessions);

    let readyOnce = false;
    const notice = new FailureNotice();
    context.subscriptions.push(
        output,
        { dispose: () => sessions.dispose() },
        { dispose: () => observed.dispose() },
        statusBar,
        status,
        contextView,
        notice,
        vscode.workspace.registerTextDocumentContentProvider(CONTEXT_SCHEME, contextView),
        daemon.onDidChangeState((state) => {
            status.setState(state);
            statusBar.setDaemonRunning(state.kind === "ready");
            notice.update(state);
            if (state.kind !== "ready") {
                return;
            }
            if (readyOnce) {
                void sessions.reopenAll();
                void observed.reobserve();
            } else if (currentConfig().observeClaudeCode) {
                void observed.observe(workspaceFolders());
            }
            readyOnce = true;
        }),
        vscode.workspace.onDidChangeWorkspaceFolders((event) => {
            if (event.removed.length > 0) {
                observed.forget(workspaceFolders());
            }
            if (daemon.state.kind === "ready" && currentConfig().observeClaudeCode) {
                void observed.observe(
                    event.added.filter((f) => f.uri.scheme === "file").map((f) => f.uri.fsPath),
                );
            }
        }),
        vscode.workspace.onDidChangeConfiguration((event) => {
            if (!event.affectsConfiguration("ctxd")) {
                return;
            }
            void sendSettings(daemon.running(), currentConfig());
            if (event.affectsConfiguration("ctxd.observeClaudeCode")) {
                // At once: off forgets the workspace's Claude Code sessions (the status
                // item shows the daemon's state), on observes the folders now, or at the
                // next start when the daemon is down.
                if (!currentConfig().observeClaudeCode) {
                    observed.forget();
                } else if (daemon.state.kind === "ready") {
                    void observed.observe(workspaceFolders());
                }
            }
            if (event.affectsConfiguration("ctxd.path") && daemon.state.kind === "failed") {
                // The fix for a failed start: try the new path at once.
                void daemon.restart();
                return;
            }
            if (RESTART_KEYS.some((key) => event.affectsConfiguration(`ctxd.${key}`))) {
                void vscode.window
                    .showInformationMessage(
                        "ctxd: the new path, state folder or log level takes effect when the daemon restarts.",
                        "Restart now",
                    )
                    .then((choice) => (choice === "Restart now" ? daemon.restart() : undefined));
            }
        }),
        ...registerCommands({
            sessions,
            observed,
            contextView,
            output,
            daemonState: () => daemon.state,
            restart: () => daemon.restart(),
            defaultModel: () => currentConfig().model,
        }),
        ...reportCompactions(sessions),
        { dispose: () => void daemon.dispose() },
    );

    await daemon.start();
    return sessions;
}

/**
 * The one notification of a daemon that cannot start: shown when a start fails (once
 * per down period), and gone by itself once the daemon runs again. A progress
 * notification, the kind an extension can close; the status item keeps the state and
 * the next retry, and its click opens the fixes.
 */
class FailureNotice implements vscode.Disposable {
    private close: (() => void) | undefined;
    private told = false;

    update(state: DaemonState): void {
        if (state.kind === "ready") {
            this.dispose();
            this.told = false;
        } else if (state.kind === "failed" && !this.told) {
            this.told = true;
            const fix =
                state.fix === "path"
                    ? "set ctxd.path to the ctxd binary"
                    : "read the log (ctxd: Show daemon log)";
            const message = `${state.reason}. It tries again on its own; to fix it, ${fix}, or click the ctxd item in the status bar.`;
            void vscode.window.withProgress(
                {
                    location: vscode.ProgressLocation.Notification,
                    title: "ctxd did not start",
                    cancellable: true,
                },
                (progress, token) =>
                    new Promise<void>((resolve) => {
                        progress.report({ message });
                        this.close = resolve;
                        token.onCancellationRequested(() => resolve());
                    }),
            );
        }
    }

    dispose(): void {
        this.close?.();
        this.close = undefined;
    }
}

export function deactivate(): void {
    // Everything is in `context.subscriptions`; disposing the controller stops the daemon.
}
