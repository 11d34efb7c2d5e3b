/**
 * One status bar item per open session, redrawn whenever the daemon sends a usage for
 * it (`ctx/usageChanged`). There is no timer and no polling: an item changes only when
 * a notification arrives, the session set changes, or the daemon stops or restarts.
 */
import * as vscode from "vscode";

import { Commands } from "./commands";
import type { Usage } from "./lsp_ext";
import { DAEMON_DOWN_TEXT, levelBackground, statusBarText, statusTooltip } from "./render";
import type { CtxdSessions } from "./sessions";

export class SessionStatusBar implements vscode.Disposable {
    private readonly items = new Map<string, vscode.StatusBarItem>();
    private readonly subscriptions: { dispose(): unknown }[] = [];
    private daemonRunning = true;

    constructor(private readonly sessions: CtxdSessions) {
        this.subscriptions.push(
            sessions.onUsageChanged(({ sessionId, usage }) => this.draw(sessionId, usage)),
            sessions.onSessionsChanged(() => this.syncItems()),
        );
        this.syncItems();
    }

    /** Marks every item as waiting for the daemon, or redraws them from the last usage. */
    setDaemonRunning(running: boolean): void {
        this.daemonRunning = running;
        for (const [sessionId] of this.items) {
            this.draw(sessionId, this.sessions.latestUsage(sessionId));
        }
    }

    /** The item of `sessionId`, for tests. */
    item(sessionId: string): vscode.StatusBarItem | undefined {
        return this.items.get(sessionId);
    }

    dispose(): void {
        for (const s of this.subscriptions) {
            s.dispose();
        }
        for (const item of this.items.values()) {
            item.dispose();
        }
        this.items.clear();
    }

    private syncItems(): void {
        const open = new Set(this.sessions.sessions().map((s) => s.sessionId));
        for (const [sessionId, item] of this.items) {
            if (!open.has(sessionId)) {
                item.dispose();
                this.items.delete(sessionId);
            }
        }
        for (const sessionId of open) {
            if (!this.items.has(sessionId)) {
                const item = vscode.window.createStatusBarItem(
                    `ctxd.session.${sessionId}`,
                    vscode.StatusBarAlignment.Right,
                    100,
                );
                item.name = "ctxd context";
                item.command = {
                    title: "Show context",
                    command: Commands.showContext,
                    arguments: [sessionId],
                };
                this.items.set(sessionId, item);
                this.draw(sessionId, this.sessions.latestUsage(sessionId));
                item.show();
            }
        }
    }

    private draw(sessionId: string, usage: Usage | undefined): void {
        const item = this.items.get(sessionId);
        if (item === undefined) {
            return;
        }
        if (!this.daemonRunning || usage === undefined) {
            item.text = this.daemonRunning ? "$(loading~spin) ctx" : DAEMON_DOWN_TEXT;
            item.tooltip = this.daemonRunning
                ? `ctxd session ${sessionId}: waiting for usage`
                : "ctxd stopped; restarting";
            item.backgroundColor = undefined;
            return;
        }
        item.text = statusBarText(usage);
        item.tooltip = new vscode.MarkdownString(statusTooltip(sessionId, usage));
        const background = levelBackground(usage.level);
        item.backgroundColor =
            background !== undefined ? new vscode.ThemeColor(background) : undefined;
    }
}
