/**
 * Entry point: wires the daemon client, the sessions API, the status bar, the context
 * view and the commands together, and returns the API other extensions use.
 */
import * as vscode from "vscode";
import { State } from "vscode-languageclient/node";

import { registerCommands, reportCompactions } from "./commands";
import { RESTART_KEYS, readConfig, type SettingKey } from "./config";
import { CONTEXT_SCHEME, ContextView } from "./contextView";
import { clientConnection, createDaemonClient, sendSettings } from "./daemon";
import { CtxdSessions, type CtxdApi } from "./sessions";
import { SessionStatusBar } from "./statusBar";

export type { CtxdApi } from "./sessions";

function currentConfig() {
    const section = vscode.workspace.getConfiguration("ctxd");
    return readConfig((key: SettingKey) => section.get(key));
}

export async function activate(context: vscode.ExtensionContext): Promise<CtxdApi> {
    const output = vscode.window.createOutputChannel("ctxd", { log: true });
    const sessions = new CtxdSessions();
    const statusBar = new SessionStatusBar(sessions);
    const client = createDaemonClient(currentConfig, output, () => statusBar.setDaemonRunning(false));
    const contextView = new ContextView(sessions);
    sessions.attach(clientConnection(client));

    let startedOnce = false;
    context.subscriptions.push(
        output,
        { dispose: () => sessions.dispose() },
        statusBar,
        contextView,
        vscode.workspace.registerTextDocumentContentProvider(CONTEXT_SCHEME, contextView),
        client.onDidChangeState(({ newState }) => {
            statusBar.setDaemonRunning(newState === State.Running);
            if (newState === State.Running) {
                if (startedOnce) {
                    void sessions.reopenAll();
                }
                startedOnce = true;
            }
        }),
        vscode.workspace.onDidChangeConfiguration((event) => {
            if (!event.affectsConfiguration("ctxd")) {
                return;
            }
            void sendSettings(client, currentConfig());
            if (RESTART_KEYS.some((key) => event.affectsConfiguration(`ctxd.${key}`))) {
                void vscode.window
                    .showInformationMessage("ctxd: restart the daemon to apply the new path, state dir or log level.", "Restart")
                    .then((choice) => (choice === "Restart" ? client.restart() : undefined));
            }
        }),
        ...registerCommands({
            sessions,
            contextView,
            output,
            restart: () => client.restart(),
            defaultModel: () => currentConfig().model,
        }),
        ...reportCompactions(sessions),
        { dispose: () => void client.dispose() },
    );

    try {
        await client.start();
    } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        void vscode.window.showErrorMessage(`ctxd did not start: ${message}`, "Show log").then((choice) => {
            if (choice === "Show log") {
                output.show(true);
            }
        });
    }
    return sessions;
}

export function deactivate(): void {
    // Everything is in `context.subscriptions`; disposing the client stops the daemon.
}
