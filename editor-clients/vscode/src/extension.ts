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
import { DaemonController, sendSettings } from "./daemon";
import { DaemonStatusItem } from "./daemonStatus";
import { registerHistory } from "./history";
import { CtxdSessions, type CtxdApi } from "./sessions";
import { SessionStatusBar } from "./statusBar";

export type { CtxdApi } from "./sessions";

function currentConfig() {
    const section = vscode.workspace.getConfiguration("ctxd");
    return readConfig((key: SettingKey) => section.get(key));
}

function workspaceFolders(): string[] {
    return (vscode.workspace.workspaceFolders ?? []).filter((f) => f.uri.scheme === "file").map((f) => f.uri.fsPath);
}

export async function activate(context: vscode.ExtensionContext): Promise<CtxdApi> {
    const output = vscode.window.createOutputChannel("ctxd", { log: true });
    const sessions = new CtxdSessions();
    const observed = new ObservedSessions(
        { request: (method, params) => sessions.request(method, params), onUsageChanged: (l) => sessions.onUsageChanged(l) },
        undefined,
        (line) => output.appendLine(line),
    );
    const statusBar = new SessionStatusBar(sessions);
    const status = new DaemonStatusItem(sessions, observed);
    const daemon = new DaemonController(currentConfig, output, (connection) => sessions.attach(connection));
    const contextView = new ContextView(sessions);

    let readyOnce = false;
    context.subscriptions.push(
        output,
        { dispose: () => sessions.dispose() },
        { dispose: () => observed.dispose() },
        statusBar,
        status,
        contextView,
        vscode.workspace.registerTextDocumentContentProvider(CONTEXT_SCHEME, contextView),
        daemon.onDidChangeState((state) => {
            status.setState(state);
            statusBar.setDaemonRunning(state.kind === "ready");
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
            if (daemon.state.kind === "ready" && currentConfig().observeClaudeCode) {
                void observed.observe(event.added.filter((f) => f.uri.scheme === "file").map((f) => f.uri.fsPath));
            }
        }),
        vscode.workspace.onDidChangeConfiguration((event) => {
            if (!event.affectsConfiguration("ctxd")) {
                return;
            }
            void sendSettings(daemon.running(), currentConfig());
            if (event.affectsConfiguration("ctxd.path") && daemon.state.kind === "failed") {
                // The fix for a failed start: try the new path at once.
                void daemon.restart();
                return;
            }
            if (RESTART_KEYS.some((key) => event.affectsConfiguration(`ctxd.${key}`))) {
                void vscode.window
                    .showInformationMessage("ctxd: restart the daemon to apply the new path, state dir or log level.", "Restart")
                    .then((choice) => (choice === "Restart" ? daemon.restart() : undefined));
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
        ...registerHistory({ sessions, observed }),
        { dispose: () => void daemon.dispose() },
    );

    await daemon.start();
    const state = daemon.state;
    if (state.kind === "failed") {
        const fix = state.fix === "path" ? "Set ctxd.path" : "Restart";
        void vscode.window.showErrorMessage(`ctxd did not start: ${state.reason}`, fix, "Show log").then((choice) => {
            if (choice === "Show log") {
                output.show(true);
            } else if (choice === "Restart") {
                void daemon.restart();
            } else if (choice === "Set ctxd.path") {
                void vscode.commands.executeCommand("workbench.action.openSettings", "ctxd.path");
            }
        });
    }
    return sessions;
}

export function deactivate(): void {
    // Everything is in `context.subscriptions`; disposing the controller stops the daemon.
}
