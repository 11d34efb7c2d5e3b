/**
 * The commands in the palette. Each picks a session (the argument, the only open one,
 * or a quick pick), sends one `ctx/` request, and reports the outcome in one message.
 * A failed request, including a method the daemon does not have yet, becomes an error
 * message (see `errors.ts`); no command throws.
 */
import * as vscode from "vscode";

import {
    type ListedTranscript,
    type ObservedSession,
    type ObservedSessions,
    isObservedId,
} from "./claude";
import type { ContextView } from "./contextView";
import type { DaemonState } from "./daemon";
import { observedText } from "./daemonStatus";
import { describeError, isMethodNotFound } from "./errors";
import { registerHistory, SEARCH_HISTORY_COMMAND } from "./history";
import type { ClaudeCompactResult, ClaudeUndoResult } from "./lsp_ext";
import { formatCount, statusText, windowReasonText, windowResultText } from "./render";
import type { CtxdSessions, SessionInfo } from "./sessions";

/**
 * Every command id the extension registers, as contributed in package.json: the one
 * list `registerCommands` registers from (the test checks it against the manifest).
 */
export const Commands = {
    compact: "ctxd.compact",
    undoCompact: "ctxd.undoCompact",
    showContext: "ctxd.showContext",
    setAutoCompactWindow: "ctxd.setAutoCompactWindow",
    clear: "ctxd.clear",
    showLog: "ctxd.showLog",
    restart: "ctxd.restart",
    fixStart: "ctxd.fixStart",
    pickClaudeSession: "ctxd.pickClaudeSession",
    searchHistory: SEARCH_HISTORY_COMMAND,
} as const;

type CommandId = (typeof Commands)[keyof typeof Commands];

export interface CommandDeps {
    sessions: CtxdSessions;
    contextView: ContextView;
    /** The workspace's Claude Code sessions the daemon observes (none in some tests). */
    observed?: ObservedSessions;
    /** The daemon's state, for the fix of a failed start. */
    daemonState?: () => DaemonState;
    output: vscode.LogOutputChannel;
    /** Restarts the daemon. */
    restart(): Promise<void>;
    /** The `ctxd.model` setting, used when no session names a model. */
    defaultModel(): string | undefined;
}

/**
 * Registers every command of `Commands` (the history search with its documents, from
 * history.ts); dispose the result to unregister them.
 */
export function registerCommands(deps: CommandDeps): vscode.Disposable[] {
    const handlers: Record<
        Exclude<CommandId, typeof Commands.searchHistory>,
        (arg?: unknown) => Promise<unknown>
    > = {
        [Commands.compact]: (arg) => compactNow(deps, arg),
        [Commands.undoCompact]: (arg) => undoCompaction(deps, arg),
        [Commands.showContext]: (arg) => showContext(deps, arg),
        [Commands.setAutoCompactWindow]: (arg) => setAutoCompactWindow(deps, arg),
        [Commands.clear]: (arg) => clearSession(deps, arg),
        [Commands.showLog]: () => Promise.resolve(deps.output.show(true)),
        [Commands.restart]: () => deps.restart(),
        [Commands.fixStart]: () => fixStart(deps),
        [Commands.pickClaudeSession]: () => pickClaudeSession(deps),
    };
    return [
        ...Object.entries(handlers).map(([id, handler]) =>
            vscode.commands.registerCommand(id, handler),
        ),
        ...registerHistory(deps),
    ];
}

/** The session a command acts on, or undefined when none is open or the pick was dismissed. */
export async function pickSession(
    sessions: CtxdSessions,
    arg: unknown,
): Promise<SessionInfo | undefined> {
    const open = sessions.sessions();
    if (typeof arg === "string") {
        const named = open.find((s) => s.sessionId === arg);
        if (named !== undefined) {
            return named;
        }
    }
    if (open.length === 0) {
        void vscode.window.showWarningMessage(
            "ctxd: no session is open, and no Claude Code session was found for this workspace. An agent extension opens sessions through the ctxd API; Claude Code sessions of the workspace folders show up on their own.",
        );
        return undefined;
    }
    if (open.length === 1) {
        return open[0];
    }
    const picked = await vscode.window.showQuickPick(
        open.map((s) => ({
            label: s.usage !== undefined ? statusText(s.usage) : "ctx (no usage yet)",
            description: s.model,
            detail: `${s.sessionId}  ${s.cwd}`,
            session: s,
        })),
        { placeHolder: "Which ctxd session?" },
    );
    return picked?.session;
}

export async function compactNow(deps: CommandDeps, arg?: unknown): Promise<void> {
    const claude = await claudeTarget(deps, arg);
    if (claude !== undefined) {
        return claude === null ? undefined : compactClaude(deps, claude);
    }
    const session = await pickSession(deps.sessions, arg);
    if (session === undefined) {
        return;
    }
    const instructions = await vscode.window.showInputBox({
        title: "ctxd: Compact now",
        prompt: "Optional focus for the summary (Enter for none)",
        placeHolder: "e.g. keep the failing test output and the plan",
    });
    if (instructions === undefined) {
        return;
    }
    try {
        const result = await vscode.window.withProgress(
            { location: vscode.ProgressLocation.Notification, title: "ctxd: compacting…" },
            () => deps.sessions.compact(session.sessionId, instructions.trim() || undefined),
        );
        for (const problem of result.problems ?? []) {
            void vscode.window.showWarningMessage(`ctxd: ${problem}`);
        }
        void vscode.window.showInformationMessage(
            `ctxd: compacted ${formatCount(result.preTokens)} → ${formatCount(result.postTokens)} tokens.`,
        );
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/compact", error));
    }
}

/** Takes back the session's latest compaction; the daemon's refusal says why it cannot. */
export async function undoCompaction(deps: CommandDeps, arg?: unknown): Promise<void> {
    const claude = await claudeTarget(deps, arg);
    if (claude !== undefined) {
        return claude === null ? undefined : undoClaude(deps, claude);
    }
    const session = await pickSession(deps.sessions, arg);
    if (session === undefined) {
        return;
    }
    try {
        const result = await deps.sessions.undoCompact(session.sessionId);
        void vscode.window.showInformationMessage(
            `ctxd: compaction undone; ${formatCount(result.preTokens)} → ${formatCount(result.postTokens)} tokens.`,
        );
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/undoCompact", error));
    }
}

export async function showContext(deps: CommandDeps, arg?: unknown): Promise<void> {
    const claude = await claudeTarget(deps, arg);
    if (claude !== undefined) {
        return claude === null ? undefined : showClaudeContext(deps, claude);
    }
    const session = await pickSession(deps.sessions, arg);
    if (session === undefined) {
        return;
    }
    try {
        const context = await deps.sessions.context(session.sessionId);
        await deps.contextView.show(session.sessionId, context);
    } catch (error) {
        if (!isMethodNotFound(error)) {
            void vscode.window.showErrorMessage(describeError("ctx/context", error));
            return;
        }
        // A daemon older than ctx/context: show the breakdown ctx/usage gives.
        try {
            const usage = await deps.sessions.usage(session.sessionId);
            const note = OLD_DAEMON_NOTE;
            await deps.contextView.show(session.sessionId, { usage, note });
        } catch (usageError) {
            void vscode.window.showErrorMessage(describeError("ctx/usage", usageError));
        }
    }
}

/** Shown above the breakdown when the daemon is too old to give the whole context view. */
export const OLD_DAEMON_NOTE =
    "This ctxd is too old to list memory files, rules and files read: the breakdown below is all it reports. Update ctxd for the whole view.";

/**
 * Parses the window input: a positive token count (`200000`, `200k`, `1m`) or `auto`.
 * The range is the daemon's to judge: it clamps a window outside it and says so in the
 * answer's `warnings`.
 */
export function parseWindow(input: string): number | "auto" | undefined {
    const text = input.trim().toLowerCase().replace(/[,_]/g, "");
    if (text === "auto") {
        return "auto";
    }
    const match = /^(\d+(?:\.\d+)?)([km]?)$/.exec(text);
    if (match === null) {
        return undefined;
    }
    const scale = match[2] === "k" ? 1_000 : match[2] === "m" ? 1_000_000 : 1;
    const value = Math.round(Number(match[1]) * scale);
    return value > 0 ? value : undefined;
}

export async function setAutoCompactWindow(deps: CommandDeps, arg?: unknown): Promise<void> {
    const open = deps.sessions.sessions();
    const named = typeof arg === "string" ? open.find((s) => s.sessionId === arg) : undefined;
    const shownClaude = open.length === 0 ? deps.observed?.shown()?.model : undefined;
    const model =
        named?.model ??
        (open.length === 1 ? open[0].model : undefined) ??
        shownClaude ??
        deps.defaultModel();
    const modelInput =
        model ??
        (await vscode.window.showInputBox({
            title: "ctxd: Set auto-compact window",
            prompt: "Model id the window applies to",
        }));
    if (modelInput === undefined || modelInput.trim() === "") {
        return;
    }
    const input = await vscode.window.showInputBox({
        title: `ctxd: auto-compact window for ${modelInput}`,
        prompt: "Tokens, 100k to 1M (e.g. 200000 or 200k), or auto to clear the saved window",
        validateInput: (value) =>
            parseWindow(value) === undefined ? "A positive token count, or auto" : undefined,
    });
    if (input === undefined) {
        return;
    }
    const window = parseWindow(input);
    if (window === undefined) {
        return;
    }
    try {
        const result = await deps.sessions.setAutoCompactWindow(modelInput.trim(), window);
        if (result.reason !== undefined) {
            void vscode.window.showWarningMessage(windowReasonText(result));
        } else {
            for (const warning of result.warnings ?? []) {
                void vscode.window.showWarningMessage(`ctxd: ${warning}`);
            }
        }
        void vscode.window.showInformationMessage(windowResultText(result));
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/setAutoCompactWindow", error));
    }
}

export async function clearSession(deps: CommandDeps, arg?: unknown): Promise<void> {
    const claude = claudeShown(deps, arg);
    if (claude !== undefined) {
        return explainClaudeClear(deps, claude);
    }
    const session = await pickSession(deps.sessions, arg);
    if (session === undefined) {
        return;
    }
    const confirm = await vscode.window.showWarningMessage(
        `Clear ctxd session ${session.sessionId}? The agent continues in a new, empty session.`,
        { modal: true },
        "Clear",
    );
    if (confirm !== "Clear") {
        return;
    }
    try {
        const newId = await deps.sessions.clear(session.sessionId);
        void vscode.window.showInformationMessage(`ctxd: cleared; the new session is ${newId}.`);
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/clear", error));
    }
}

/**
 * The Claude Code session "Clear session" is about: the one named, or, with no agent
 * extension's session open, the one the status item shows.
 */
function claudeShown(deps: CommandDeps, arg: unknown): ObservedSession | undefined {
    if (typeof arg === "string") {
        return isObservedId(arg) ? deps.observed?.get(arg) : undefined;
    }
    return deps.sessions.sessions().length === 0 ? deps.observed?.shown() : undefined;
}

/** The button that compacts the Claude Code session instead of clearing it. */
export const COMPACT_INSTEAD = "Compact it instead";

/**
 * A Claude Code session is Claude Code's to clear: says how (its own /clear), that the
 * status item follows the new session, and offers what ctxd can do (compact it).
 */
async function explainClaudeClear(deps: CommandDeps, session: ObservedSession): Promise<void> {
    const choice = await vscode.window.showInformationMessage(
        `ctxd: the status bar shows the Claude Code session ${session.claudeSessionId ?? session.sessionId}, which Claude Code keeps, so ctxd does not clear it. Type /clear in Claude Code to start a new conversation: the status bar follows the new session on its own. To make this one smaller, compact it.`,
        COMPACT_INSTEAD,
    );
    if (choice === COMPACT_INSTEAD) {
        await compactClaude(deps, session);
    }
}

/**
 * Tells the user when the daemon compacted a session on its own (at the threshold, say)
 * or could not. A `manual` compaction was asked for with `ctx/compact`, whose caller
 * reports it (Compact now does), so its `ctx/compacted` is not shown a second time.
 */
export function reportCompactions(sessions: CtxdSessions): { dispose(): unknown }[] {
    return [
        sessions.onCompacted(({ trigger, preTokens, postTokens }) => {
            if (trigger === "manual") {
                return;
            }
            void vscode.window.showInformationMessage(
                `ctxd: compacted (${trigger}) ${formatCount(preTokens)} → ${formatCount(postTokens)} tokens.`,
            );
        }),
        sessions.onCompactFailed(({ reason }) => {
            void vscode.window.showWarningMessage(`ctxd: compaction failed: ${reason}`);
        }),
    ];
}

/**
 * The observed Claude Code session a command acts on: `undefined` when the command is for
 * an agent extension's session (one is named, or one is open, or none is observed),
 * `null` when the pick was dismissed.
 */
async function claudeTarget(
    deps: CommandDeps,
    arg: unknown,
): Promise<ObservedSession | null | undefined> {
    const observed = deps.observed;
    if (observed === undefined) {
        return undefined;
    }
    if (typeof arg === "string") {
        return isObservedId(arg) ? (observed.get(arg) ?? null) : undefined;
    }
    if (deps.sessions.sessions().length > 0) {
        return undefined;
    }
    // The session the status item shows first.
    const shown = observed.shown();
    const all = observed
        .sessions()
        .sort(
            (a, b) =>
                Number(b.sessionId === shown?.sessionId) - Number(a.sessionId === shown?.sessionId),
        );
    if (all.length === 0) {
        return undefined;
    }
    if (all.length === 1) {
        return all[0];
    }
    return (await pickObserved(all)) ?? null;
}

async function pickObserved(all: ObservedSession[]): Promise<ObservedSession | undefined> {
    const picked = await vscode.window.showQuickPick(
        all.map((s, i) => ({
            label: observedText(s).replace(/^\$\([^)]*\) /, ""),
            description: i === 0 ? "in the status bar" : undefined,
            detail: `${s.claudeSessionId ?? s.sessionId}  ${s.folder}`,
            session: s,
        })),
        { placeHolder: "Which Claude Code session?" },
    );
    return picked?.session;
}

/** The picker's entry that unpins the status item. */
export const FOLLOW_NEWEST = "Follow the session that changed last";

/**
 * The session picker: every transcript of the workspace's Claude Code project folders,
 * newest written first (the files on disk, so every editor lists the same). The chosen
 * session is pinned to the status item and its context shown; a session the daemon does
 * not follow yet is followed first. When one is pinned, the first entry follows the
 * session that changed last again.
 */
export async function pickClaudeSession(deps: CommandDeps): Promise<void> {
    const observed = deps.observed;
    const listed = observed?.listed() ?? [];
    if (observed === undefined || listed.length === 0) {
        void vscode.window.showInformationMessage(
            "ctxd: no Claude Code session found for this workspace's folders yet.",
        );
        return;
    }
    const shown = observed.shown()?.sessionId;
    const pinned = observed.pinned();
    type Item = { label: string; description?: string; detail?: string; listed?: ListedTranscript };
    const items: Item[] = [];
    if (pinned !== undefined) {
        items.push({ label: FOLLOW_NEWEST, description: "unpin the status bar" });
    }
    for (const l of listed) {
        const here = l.session?.sessionId === shown && shown !== undefined;
        items.push({
            label:
                l.session?.usage !== undefined
                    ? observedText(l.session).replace(/^\$\([^)]*\) /, "")
                    : "not followed yet",
            description: here
                ? pinned !== undefined
                    ? "pinned in the status bar"
                    : "in the status bar"
                : undefined,
            detail: `${l.claudeSessionId}  ${l.folder}`,
            listed: l,
        });
    }
    const picked = await vscode.window.showQuickPick(items, {
        placeHolder: "Which Claude Code session? (shown in the status bar from now on)",
    });
    if (picked === undefined) {
        return;
    }
    if (picked.listed === undefined) {
        observed.pin(undefined);
        return;
    }
    let session: ObservedSession;
    try {
        session = await observed.follow(picked.listed);
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/observe", error));
        return;
    }
    observed.pin(session.sessionId);
    await showClaudeContext(deps, session);
}

export async function showClaudeContext(
    deps: CommandDeps,
    session: ObservedSession,
): Promise<void> {
    const usage = session.usage;
    if (usage === undefined) {
        void vscode.window.showInformationMessage(
            "ctxd: no usage for this Claude Code session yet.",
        );
        return;
    }
    const model = session.model !== undefined ? `, model ${session.model}` : "";
    const note = `Claude Code session ${session.claudeSessionId ?? session.sessionId} (${session.transcript ?? session.projectDir}${model}), observed by ctxd: the view follows its transcript as Claude Code writes it.`;
    await deps.contextView.show(session.sessionId, { usage, note });
}

function claudeParams(session: ObservedSession, instructions?: string): Record<string, string> {
    const params: Record<string, string> = {};
    if (session.transcript !== undefined) {
        params.transcript = session.transcript;
    }
    if (session.claudeSessionId !== undefined) {
        params.sessionId = session.claudeSessionId;
    }
    if (instructions !== undefined && instructions !== "") {
        params.instructions = instructions;
    }
    return params;
}

export async function compactClaude(deps: CommandDeps, session: ObservedSession): Promise<void> {
    const transcript = session.transcript ?? session.projectDir;
    const confirm = await vscode.window.showWarningMessage(
        `Compact the Claude Code session ${session.claudeSessionId ?? session.sessionId}? ctxd appends a compact boundary and a summary to ${transcript}; Claude Code continues from the summary when the session is resumed. Nothing is removed: "ctxd: Undo last compaction" takes it back until the next turn.`,
        { modal: true },
        "Compact",
    );
    if (confirm !== "Compact") {
        return;
    }
    const instructions = await vscode.window.showInputBox({
        title: "ctxd: Compact the Claude Code session",
        prompt: "Optional focus for the summary (Enter for none)",
    });
    if (instructions === undefined) {
        return;
    }
    try {
        const result = await vscode.window.withProgress(
            {
                location: vscode.ProgressLocation.Notification,
                title: "ctxd: compacting the Claude Code session…",
            },
            () =>
                deps.sessions.request<Partial<ClaudeCompactResult>>(
                    "ctx/claudeCompact",
                    claudeParams(session, instructions.trim()),
                ),
        );
        const numbers =
            result?.preTokens !== undefined && result.postTokens !== undefined
                ? ` ${formatCount(result.preTokens)} → ${formatCount(result.postTokens)} tokens`
                : "";
        // Who wrote the summary, and why the configured provider did not when it fell back.
        const by = result?.summarizer ? `, summary by ${result.summarizer}` : "";
        void vscode.window.showInformationMessage(
            `ctxd: Claude Code session compacted${numbers}${by}.`,
        );
        for (const problem of result?.problems ?? []) {
            void vscode.window.showWarningMessage(`ctxd: ${problem}`);
        }
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/claudeCompact", error));
    }
}

export async function undoClaude(deps: CommandDeps, session: ObservedSession): Promise<void> {
    try {
        // Token figures when the daemon's answer has them (older answers do not).
        const result = await deps.sessions.request<
            Partial<ClaudeUndoResult> & { preTokens?: number; postTokens?: number }
        >("ctx/claudeUndo", claudeParams(session));
        const numbers =
            result?.preTokens !== undefined && result.postTokens !== undefined
                ? `: ${formatCount(result.preTokens)} → ${formatCount(result.postTokens)} tokens`
                : "";
        void vscode.window.showInformationMessage(
            `ctxd: the Claude Code session's last compaction is undone${numbers}; the transcript is as it was before it.`,
        );
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/claudeUndo", error));
    }
}

/** The fix for a failed start: set the path, restart, or read the log. */
export async function fixStart(deps: CommandDeps): Promise<void> {
    const state = deps.daemonState?.();
    const reason = state?.kind === "failed" ? state.reason : "ctxd is not failing now";
    const choice = await vscode.window.showQuickPick(
        [
            {
                label: "Set ctxd.path",
                detail: "Open the setting (user settings work in remote windows too)",
                id: "path",
            },
            {
                label: "Restart ctxd",
                detail: "Start the daemon again with the current settings",
                id: "restart",
            },
            {
                label: "Show log",
                detail: "The client's start attempts and the daemon's own log",
                id: "log",
            },
        ],
        { placeHolder: reason },
    );
    switch (choice?.id) {
        case "path":
            await vscode.commands.executeCommand("workbench.action.openSettings", "ctxd.path");
            break;
        case "restart":
            await deps.restart();
            break;
        case "log":
            deps.output.show(true);
            break;
    }
}
