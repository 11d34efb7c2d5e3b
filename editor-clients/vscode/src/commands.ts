/**
 * The commands in the palette. Each picks a session (the argument, the only open one,
 * or a quick pick), sends one `ctx/` request, and reports the outcome in one message.
 * A failed request, including a method the daemon does not have yet, becomes an error
 * message (see `errors.ts`); no command throws.
 */
import * as vscode from "vscode";

import type { ContextView } from "./contextView";
import { describeError, isMethodNotFound } from "./errors";
import { formatCount, statusText, windowResultText } from "./render";
import type { CtxdSessions, SessionInfo } from "./sessions";

/** Command ids, as contributed in package.json. */
export const Commands = {
    compact: "ctxd.compact",
    undoCompact: "ctxd.undoCompact",
    showContext: "ctxd.showContext",
    setAutoCompactWindow: "ctxd.setAutoCompactWindow",
    clear: "ctxd.clear",
    showLog: "ctxd.showLog",
    restart: "ctxd.restart",
} as const;

export interface CommandDeps {
    sessions: CtxdSessions;
    contextView: ContextView;
    output: vscode.LogOutputChannel;
    /** Restarts the daemon. */
    restart(): Promise<void>;
    /** The `ctxd.model` setting, used when no session names a model. */
    defaultModel(): string | undefined;
}

/** Registers every command; dispose the result to unregister them. */
export function registerCommands(deps: CommandDeps): vscode.Disposable[] {
    const handlers: Record<(typeof Commands)[keyof typeof Commands], (arg?: unknown) => Promise<unknown>> = {
        [Commands.compact]: (arg) => compactNow(deps, arg),
        [Commands.undoCompact]: (arg) => undoCompaction(deps, arg),
        [Commands.showContext]: (arg) => showContext(deps, arg),
        [Commands.setAutoCompactWindow]: (arg) => setAutoCompactWindow(deps, arg),
        [Commands.clear]: (arg) => clearSession(deps, arg),
        [Commands.showLog]: async () => deps.output.show(true),
        [Commands.restart]: () => deps.restart(),
    };
    return Object.entries(handlers).map(([id, handler]) => vscode.commands.registerCommand(id, handler));
}

/** The session a command acts on, or undefined when none is open or the pick was dismissed. */
export async function pickSession(sessions: CtxdSessions, arg: unknown): Promise<SessionInfo | undefined> {
    const open = sessions.sessions();
    if (typeof arg === "string") {
        const named = open.find((s) => s.sessionId === arg);
        if (named !== undefined) {
            return named;
        }
    }
    if (open.length === 0) {
        void vscode.window.showWarningMessage("ctxd: no session is open. An agent extension opens sessions through the ctxd API.");
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
            const note = `This ctxd has no ctx/context yet (${describeError("ctx/context", error)}) The breakdown below is from ctx/usage; memory files appear once the daemon answers ctx/context.`;
            await deps.contextView.show(session.sessionId, { usage, note });
        } catch (usageError) {
            void vscode.window.showErrorMessage(describeError("ctx/usage", usageError));
        }
    }
}

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
    const model = named?.model ?? (open.length === 1 ? open[0].model : undefined) ?? deps.defaultModel();
    const modelInput =
        model ??
        (await vscode.window.showInputBox({ title: "ctxd: Set auto-compact window", prompt: "Model id the window applies to" }));
    if (modelInput === undefined || modelInput.trim() === "") {
        return;
    }
    const input = await vscode.window.showInputBox({
        title: `ctxd: auto-compact window for ${modelInput}`,
        prompt: "Tokens, 100k to 1M (e.g. 200000 or 200k), or auto to clear the saved window",
        validateInput: (value) => (parseWindow(value) === undefined ? "A positive token count, or auto" : undefined),
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
        for (const warning of result.warnings ?? []) {
            void vscode.window.showWarningMessage(`ctxd: ${warning}`);
        }
        void vscode.window.showInformationMessage(windowResultText(result));
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/setAutoCompactWindow", error));
    }
}

export async function clearSession(deps: CommandDeps, arg?: unknown): Promise<void> {
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
