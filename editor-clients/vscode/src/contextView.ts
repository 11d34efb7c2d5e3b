/**
 * The context view: a read-only markdown document per session (`ctxd-context:` URIs)
 * listing the breakdown and the memory files. It redraws when the daemon sends a new
 * usage for a session on screen; memory files stay as the last `ctx/context` gave them.
 */
import * as vscode from "vscode";

import type { ContextResult, Usage } from "./lsp_ext";
import { contextDocument } from "./render";
import type { CtxdSessions } from "./sessions";

export const CONTEXT_SCHEME = "ctxd-context";

/** What the view shows for one session. */
export interface ContextSnapshot {
    usage: Usage;
    memoryFiles?: ContextResult["memoryFiles"];
    pendingRules?: ContextResult["pendingRules"];
    /** Shown above the content (e.g. that the daemon has no `ctx/context` yet). */
    note?: string;
}

export class ContextView implements vscode.TextDocumentContentProvider, vscode.Disposable {
    private readonly changed = new vscode.EventEmitter<vscode.Uri>();
    private readonly snapshots = new Map<string, ContextSnapshot>();
    private readonly subscription: { dispose(): unknown };

    readonly onDidChange = this.changed.event;

    constructor(sessions: CtxdSessions) {
        this.subscription = sessions.onUsageChanged(({ sessionId, usage }) => {
            const shown = this.snapshots.get(sessionId);
            if (shown !== undefined) {
                this.snapshots.set(sessionId, { ...shown, usage });
                this.changed.fire(uriOf(sessionId));
            }
        });
    }

    provideTextDocumentContent(uri: vscode.Uri): string {
        const sessionId = sessionOf(uri);
        const snapshot = this.snapshots.get(sessionId);
        if (snapshot === undefined) {
            return `# ctxd context: ${sessionId}\n\nRun "ctxd: Show context" to load it.\n`;
        }
        return contextDocument(sessionId, snapshot, snapshot.note);
    }

    /** Stores what to show for `sessionId` and opens (or refreshes) its document. */
    async show(sessionId: string, snapshot: ContextSnapshot): Promise<vscode.Uri> {
        const uri = uriOf(sessionId);
        this.snapshots.set(sessionId, snapshot);
        this.changed.fire(uri);
        const document = await vscode.workspace.openTextDocument(uri);
        await vscode.window.showTextDocument(document, { preview: true, preserveFocus: false });
        return uri;
    }

    dispose(): void {
        this.subscription.dispose();
        this.changed.dispose();
    }
}

function uriOf(sessionId: string): vscode.Uri {
    return vscode.Uri.from({ scheme: CONTEXT_SCHEME, path: `/${sessionId}.md` });
}

function sessionOf(uri: vscode.Uri): string {
    return uri.path.replace(/^\//, "").replace(/\.md$/, "");
}
