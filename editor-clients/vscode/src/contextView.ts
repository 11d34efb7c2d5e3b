/**
 * The context view: a read-only markdown document per session (`ctxd-context:` URIs)
 * with the breakdown, the memory files, the rules waiting for a read, and the read
 * files. It shows the `ctx/context` answer and asks again when the daemon says the
 * session changed: `ctx/usageChanged` (the pushed usage has no memory-file split, so
 * the view takes the usage `ctx/context` gives) and `ctx/contextChanged` (a memory file
 * or a read file changed on disk). The latest answer wins.
 *
 * With a daemon that has no `ctx/context` (error -32601) the view shows the usage only,
 * with a note, and redraws from each `ctx/usageChanged`.
 */
import * as vscode from "vscode";

import type { Usage } from "./lsp_ext";
import { type ContextContent, contextDocument } from "./render";
import type { CtxdSessions } from "./sessions";

export const CONTEXT_SCHEME = "ctxd-context";

/** What the view shows for one session. */
export interface ContextSnapshot extends ContextContent {
    /** Shown above the content (e.g. that the daemon has no `ctx/context`). */
    note?: string;
}

/** True when the snapshot is a `ctx/context` answer (not only a usage). */
function fromContext(snapshot: ContextSnapshot): boolean {
    return snapshot.memoryFiles !== undefined;
}

export class ContextView implements vscode.TextDocumentContentProvider, vscode.Disposable {
    private readonly changed = new vscode.EventEmitter<vscode.Uri>();
    private readonly snapshots = new Map<string, ContextSnapshot>();
    /** Bumped at every show and refresh of a session; an older answer is dropped. */
    private readonly generations = new Map<string, number>();
    private readonly subscriptions: { dispose(): unknown }[];

    readonly onDidChange = this.changed.event;

    constructor(private readonly sessions: CtxdSessions) {
        this.subscriptions = [
            sessions.onUsageChanged(({ sessionId, usage }) => this.usageChanged(sessionId, usage)),
            sessions.onContextChanged(({ sessionId }) => {
                const shown = this.snapshots.get(sessionId);
                if (shown !== undefined && fromContext(shown)) {
                    void this.refresh(sessionId);
                }
            }),
            vscode.workspace.onDidCloseTextDocument((document) => {
                if (document.uri.scheme === CONTEXT_SCHEME) {
                    this.snapshots.delete(sessionOf(document.uri));
                }
            }),
        ];
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
        this.nextGeneration(sessionId);
        this.update(sessionId, snapshot);
        const document = await vscode.workspace.openTextDocument(uri);
        await vscode.window.showTextDocument(document, { preview: true, preserveFocus: false });
        return uri;
    }

    /**
     * Asks `ctx/context` again for a session on screen and redraws. When that fails (the
     * daemon is restarting, say), `usage` (if given) is drawn over what is shown.
     */
    async refresh(sessionId: string, usage?: Usage): Promise<void> {
        const generation = this.nextGeneration(sessionId);
        const current = () =>
            this.generations.get(sessionId) === generation && this.snapshots.has(sessionId);
        try {
            const context = await this.sessions.context(sessionId);
            if (current()) {
                this.update(sessionId, context);
            }
        } catch {
            const shown = this.snapshots.get(sessionId);
            if (usage !== undefined && shown !== undefined && current()) {
                this.update(sessionId, { ...shown, usage });
            }
        }
    }

    dispose(): void {
        for (const s of this.subscriptions) {
            s.dispose();
        }
        this.changed.dispose();
    }

    private usageChanged(sessionId: string, usage: Usage): void {
        const shown = this.snapshots.get(sessionId);
        if (shown === undefined) {
            return;
        }
        if (fromContext(shown)) {
            void this.refresh(sessionId, usage);
        } else {
            this.update(sessionId, { ...shown, usage });
        }
    }

    private nextGeneration(sessionId: string): number {
        const generation = (this.generations.get(sessionId) ?? 0) + 1;
        this.generations.set(sessionId, generation);
        return generation;
    }

    private update(sessionId: string, snapshot: ContextSnapshot): void {
        this.snapshots.set(sessionId, snapshot);
        this.changed.fire(uriOf(sessionId));
    }
}

function uriOf(sessionId: string): vscode.Uri {
    return vscode.Uri.from({ scheme: CONTEXT_SCHEME, path: `/${sessionId}.md` });
}

function sessionOf(uri: vscode.Uri): string {
    return uri.path.replace(/^\//, "").replace(/\.md$/, "");
}
