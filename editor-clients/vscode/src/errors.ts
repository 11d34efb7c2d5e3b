/**
 * Turning a failed request into one sentence a person can act on: what could not be
 * done, why in plain words, and what to do, with no method names or error codes. The
 * Neovim client words them the same (`lua/ctxd/errors.lua`); both are checked against
 * `editor-clients/fixtures/error-cases.json`.
 */
import { type CannotUndoReason, ErrorCodes } from "./lsp_ext";

/** The code of a JSON-RPC error, when `error` is one. */
export function errorCode(error: unknown): number | undefined {
    if (typeof error === "object" && error !== null && "code" in error) {
        const code = error.code;
        return typeof code === "number" ? code : undefined;
    }
    return undefined;
}

function errorMessage(error: unknown): string {
    if (error instanceof Error) {
        return error.message;
    }
    if (typeof error === "object" && error !== null && "message" in error) {
        return String(error.message);
    }
    return String(error);
}

function errorReason(error: unknown): unknown {
    if (typeof error === "object" && error !== null && "data" in error) {
        const data = error.data;
        return typeof data === "object" && data !== null
            ? (data as { reason?: unknown }).reason
            : undefined;
    }
    return undefined;
}

/** What each reason of a `ctx/undoCompact` refusal means; a reason added to the
 * protocol does not compile until it is worded here. */
const cannotUndo: Record<CannotUndoReason, string> = {
    nothingToUndo: "this session has no compaction to undo.",
    newTurnSince: "a new turn came after it, and undoing it now would lose that turn.",
};

/** True when the daemon answered "unknown method" (it does not implement `method`). */
export function isMethodNotFound(error: unknown): boolean {
    return errorCode(error) === ErrorCodes.MethodNotFound;
}

/** What each request does, as the user asked for it. */
const ACTIONS: Record<string, string> = {
    "ctx/compact": "compact the session",
    "ctx/undoCompact": "undo the compaction",
    "ctx/claudeCompact": "compact the Claude Code session",
    "ctx/claudeUndo": "undo a compaction of the Claude Code session",
    "ctx/context": "show the context",
    "ctx/usage": "read the session's usage",
    "ctx/setAutoCompactWindow": "save the auto-compact window",
    "ctx/clear": "clear the session",
    "ctx/observe": "follow the Claude Code sessions",
    "ctx/searchHistory": "search the session's history",
    "ctx/readHistory": "read the history record",
};

/** JSON-RPC codes the client's connection gives when the daemon went away mid-request. */
const CONNECTION_LOST = new Set([-32099, -32098, -32097, -32096]);

const RESTARTS = "It restarts on its own; try again in a moment.";

/** `text` as a sentence: trimmed, ending with a full stop. */
function sentence(text: string): string {
    const trimmed = text.trim();
    return /[.!?]$/.test(trimmed) ? trimmed : `${trimmed}.`;
}

/**
 * A refusal of the Claude Code compaction or undo (`<transcript>: <why>; nothing was
 * written`): the why, that nothing changed, and what to do when Claude Code has the
 * session.
 */
function claudeRefusal(why: string): string {
    const busy = /is running for this session|has it open/.test(why);
    return `${sentence(why)} The transcript is as it was${busy ? "; quit Claude Code, or wait until it is done, then try again." : "."}`;
}

function reason(method: string, error: unknown): string {
    const code = errorCode(error);
    const message = errorMessage(error);
    // The Claude Code methods name the transcript first and say nothing was written last;
    // the daemon's own refusals start with what failed, which the sentence says already.
    const why = message
        .replace(/^\/.*?\.jsonl: /, "")
        .replace(/; nothing was written$/, "")
        .replace(/^(compaction failed|cannot undo): /, "");
    switch (code) {
        case ErrorCodes.MethodNotFound:
            return `this ctxd is too old to do that. Update ctxd${method === "ctx/claudeCompact" ? ", or run /compact in Claude Code." : "."}`;
        case ErrorCodes.CannotUndo: {
            const data = errorReason(error);
            if (typeof data === "string" && Object.hasOwn(cannotUndo, data)) {
                return cannotUndo[data as CannotUndoReason];
            }
            if (why.includes("is not ctxd's")) {
                return "the transcript does not end with a compaction by ctxd, so there is nothing of ctxd's to undo.";
            }
            const after = /^(\d+) lines? came after ctxd's compaction/.exec(why);
            if (after !== null) {
                return `Claude Code wrote ${after[1]} lines after ctxd's compaction, and undoing it would take them away. The transcript is as it was.`;
            }
            return method === "ctx/claudeUndo" ? claudeRefusal(why) : sentence(why);
        }
        case ErrorCodes.CompactFailed:
            return method === "ctx/claudeCompact"
                ? claudeRefusal(why)
                : `${sentence(why)} Nothing was changed.`;
        case ErrorCodes.Busy:
            return `the session is busy (${message}). Try again when it is done.`;
        case ErrorCodes.UnknownSession:
            return "ctxd does not know this session (it may have been closed).";
        case ErrorCodes.SessionClosed:
            return "the session was closed.";
        case ErrorCodes.Store:
        case ErrorCodes.StoreLocked:
            return `ctxd could not read or write its store (${message}). The daemon's log has more.`;
        case ErrorCodes.Internal:
        case -32603:
            return `something went wrong inside ctxd (${message}). The daemon's log has more.`;
    }
    if (
        (code !== undefined && CONNECTION_LOST.has(code)) ||
        (code === undefined && /exited before answering|disposed|got closed/.test(message))
    ) {
        return `ctxd stopped before it answered. ${RESTARTS}`;
    }
    if (code === undefined && /^ctxd is not running/.test(message)) {
        return `ctxd is not running right now. ${RESTARTS}`;
    }
    return sentence(message);
}

/** The one sentence shown when `method` failed with `error`. */
export function describeError(method: string, error: unknown): string {
    return `ctxd could not ${ACTIONS[method] ?? "do that"}: ${reason(method, error)}`;
}
