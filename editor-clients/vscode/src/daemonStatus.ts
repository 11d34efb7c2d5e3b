/**
 * The one status item shown from activation on: the daemon's state (starting, ready,
 * restarting in N s, failed: reason · retrying in N s) and, once ready with no session
 * of an agent extension open, a Claude Code session of the workspace (model, tokens,
 * percent of the window, tokens until compaction, level): the one pinned from
 * the picker, else the one that changed last.
 *
 * Clicking it opens what helps: the fix for a failed start, the context view of the
 * shown session, or the log.
 */
import * as vscode from "vscode";

import type { ObservedSession, ObservedSessions } from "./claude";
import type { DaemonState } from "./daemon";
import { cacheText, formatTokens, levelBackground, statusBarText, statusTooltip } from "./render";
import type { CtxdSessions } from "./sessions";

/** The label of the status item for a daemon state (and the shown session, when ready). */
export function daemonStatusText(
    state: DaemonState,
    shown: ObservedSession | undefined,
    now: number,
): string {
    switch (state.kind) {
        case "starting":
            return "$(loading~spin) ctxd starting";
        case "restarting":
            return `$(debug-disconnect) ctxd restarting in ${secondsUntil(state.at, now)} s`;
        case "failed":
            return `$(error) ctxd failed: ${failureCause(state.reason)} · retrying in ${secondsUntil(state.retryAt, now)} s`;
        case "ready":
            if (shown?.usage === undefined) {
                return "$(pulse) ctxd ready";
            }
            return observedText(shown);
    }
}

function secondsUntil(at: number, now: number): number {
    return Math.max(0, Math.ceil((at - now) / 1000));
}

/**
 * `$(dashboard) ctx 45.0% · 77.0k to compact · 90.0k · claude-opus-4-6`, and once its
 * prompt cache went cold what that costs and the fix (`cacheText`).
 */
export function observedText(session: ObservedSession): string {
    const usage = session.usage;
    if (usage === undefined) {
        return "$(loading~spin) ctx";
    }
    const model = session.model !== undefined ? ` · ${session.model.replace(/-\d{8}$/, "")}` : "";
    const cache = cacheText(usage.cache);
    return `${statusBarText(usage)} · ${formatTokens(usage.tokens)}${model}${cache !== "" ? ` · ${cache}` : ""}`;
}

/** The cause alone (`not found`, `not executable`, `exited with code 3`); the tooltip has the rest. */
export function failureCause(reason: string): string {
    const cause = reason.split("\n")[0].split(":")[0];
    return cause.length <= 40 ? cause : `${cause.slice(0, 39)}…`;
}

export class DaemonStatusItem implements vscode.Disposable {
    readonly item: vscode.StatusBarItem;
    private state: DaemonState = { kind: "starting" };
    private timer: NodeJS.Timeout | undefined;
    private readonly subscriptions: { dispose(): unknown }[] = [];

    constructor(
        private readonly sessions: CtxdSessions,
        private readonly observed: ObservedSessions,
    ) {
        this.item = vscode.window.createStatusBarItem(
            "ctxd.status",
            vscode.StatusBarAlignment.Right,
            101,
        );
        this.item.name = "ctxd";
        this.subscriptions.push(
            observed.onDidChange(() => this.draw()),
            sessions.onSessionsChanged(() => this.draw()),
        );
        this.draw();
        this.item.show();
    }

    setState(state: DaemonState): void {
        this.state = state;
        if (this.timer !== undefined) {
            clearInterval(this.timer);
            this.timer = undefined;
        }
        if (state.kind === "restarting" || state.kind === "failed") {
            // The countdown: redrawn each second until the client starts again.
            this.timer = setInterval(() => this.draw(), 1000);
        }
        this.draw();
    }

    /** The observed session the item shows (none while an agent extension has sessions open). */
    shown(): ObservedSession | undefined {
        return this.sessions.sessions().length > 0 ? undefined : this.observed.shown();
    }

    dispose(): void {
        if (this.timer !== undefined) {
            clearInterval(this.timer);
        }
        for (const s of this.subscriptions) {
            s.dispose();
        }
        this.item.dispose();
    }

    private draw(): void {
        const shown = this.state.kind === "ready" ? this.shown() : undefined;
        this.item.text = daemonStatusText(this.state, shown, Date.now());
        this.item.backgroundColor = undefined;
        switch (this.state.kind) {
            case "failed":
                this.item.tooltip = `ctxd could not start: ${this.state.reason}\n\nIt tries again in ${secondsUntil(this.state.retryAt, Date.now())} s on its own (waiting longer after each failure, up to 30 s). Click to fix it now: set ctxd.path, restart, or read the log.`;
                this.item.command = { title: "Fix ctxd", command: "ctxd.fixStart" };
                this.item.backgroundColor = new vscode.ThemeColor("statusBarItem.errorBackground");
                break;
            case "ready":
                if (shown?.usage !== undefined) {
                    const where = shown.transcript ?? shown.projectDir;
                    const which =
                        this.observed.pinned() !== undefined
                            ? "pinned from *Show a Claude Code session of the workspace* (its first entry follows the session that changed last again)"
                            : "the one that changed last";
                    this.item.tooltip = new vscode.MarkdownString(
                        `${statusTooltip(shown.sessionId, shown.usage)}\n\nClaude Code session \`${where}\`, ${which}`,
                    );
                    this.item.command = {
                        title: "Show context",
                        command: "ctxd.showContext",
                        arguments: [shown.sessionId],
                    };
                    const background = levelBackground(shown.usage.level);
                    this.item.backgroundColor =
                        background !== undefined ? new vscode.ThemeColor(background) : undefined;
                } else {
                    const waiting = this.observed
                        .unobserved()
                        .map((u) => `- ${u.folder}: ${u.reason}`);
                    this.item.tooltip = [
                        "ctxd is running.",
                        ...(waiting.length > 0
                            ? ["", "No Claude Code session yet:", ...waiting]
                            : []),
                        "",
                        "Click for the log.",
                    ].join("\n");
                    this.item.command = { title: "Show log", command: "ctxd.showLog" };
                }
                break;
            case "restarting":
                this.item.tooltip = `${this.state.reason}; it starts again in ${secondsUntil(this.state.at, Date.now())} s (waiting longer after each exit, up to 30 s). Click for the log.`;
                this.item.command = { title: "Show log", command: "ctxd.showLog" };
                break;
            default:
                this.item.tooltip = "ctxd: click for the log";
                this.item.command = { title: "Show log", command: "ctxd.showLog" };
        }
    }
}
