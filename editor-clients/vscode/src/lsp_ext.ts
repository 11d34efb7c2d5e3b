/**
 * The ctxd protocol as TypeScript types: every `ctx/` request and notification this
 * client uses, in one file.
 *
 * This file mirrors `daemon/proto/src/lib.rs` (field truth: `schemas/*.json`) and the
 * method table of `shared/design/PROTOCOL.md` by hand. `test/protocol.test.ts` fails
 * when a field named in the schemas is missing here. Methods the daemon does not answer
 * yet are declared too; calling them yields JSON-RPC error -32601, which the callers
 * turn into a readable message (see `errors.ts`).
 *
 * It imports only `vscode-jsonrpc`, never `vscode`, so the tests can load it in Node.
 */
import { NotificationType, RequestType } from "vscode-jsonrpc";

// ---------------------------------------------------------------------------------
// Shared shapes

export type Level = "ok" | "warning" | "compacting" | "blocked";

export interface MessageBreakdown {
    toolResults: number;
    summaries: number;
    other: number;
}

/** Where the tokens go; the parts add up to `window`. */
export interface Breakdown {
    systemPrompt: number;
    tools: number;
    memoryFiles: number;
    skills: number;
    messages: MessageBreakdown;
    freeSpace: number;
    autocompactBuffer: number;
}

/** How full a session's context is, with every level a status bar needs. */
export interface Usage {
    tokens: number;
    reportedTokens: number;
    estimatedTokens: number;
    window: number;
    effectiveWindow: number;
    threshold: number;
    warning: number;
    blocked: number;
    percentUsed: number;
    percentUntilCompact: number;
    tokensUntilCompact: number;
    level: Level;
    autoCompactEnabled: boolean;
    breakdown: Breakdown;
}

/** A transcript record: one line of a Claude Code style JSONL transcript. */
export type TranscriptRecord = Record<string, unknown>;

/** What ctxd announces under `capabilities.experimental.ctxd` in `initialize`. */
export interface CtxdCapabilities {
    version: string;
    protocol: number;
    methods: string[];
    notifications: string[];
    stateDir: string;
    /** The daemon's process id. */
    processId: number;
}

/** `initializationOptions` of `initialize`. */
export interface InitializationOptions {
    stateDir?: string;
    /** Client data: the window the client wants (below env and settings files). */
    autoCompactWindow?: number;
    settings?: Record<string, unknown>;
}

export interface SessionParams {
    sessionId: string;
}

// ---------------------------------------------------------------------------------
// Requests the daemon answers today

export interface OpenSessionParams {
    cwd: string;
    model: string;
    sessionId?: string;
    /** Path of a Claude Code transcript to load (not answered by the daemon yet). */
    import?: string;
}
export interface OpenSessionResult {
    sessionId: string;
    resumed: boolean;
    records: number;
    diagnostics?: string[];
    usage: Usage;
}
export const openSession = new RequestType<OpenSessionParams, OpenSessionResult, void>("ctx/openSession");

export interface AppendParams {
    sessionId: string;
    records: TranscriptRecord[];
}
export interface AppendResult {
    appended: number;
    duplicates: number;
    records: number;
    usage: Usage;
}
export const append = new RequestType<AppendParams, AppendResult, void>("ctx/append");

export interface UsageResult {
    sessionId: string;
    usage: Usage;
}
export const usage = new RequestType<SessionParams, UsageResult, void>("ctx/usage");

export const closeSession = new RequestType<SessionParams, null, void>("ctx/closeSession");

// ---------------------------------------------------------------------------------
// Requests named by PROTOCOL.md that the daemon does not answer yet (-32601 until then)

export interface CompactParams {
    sessionId: string;
    /** Focus instructions for the summary. */
    instructions?: string;
}
export interface CompactResult {
    boundary: string;
    preTokens: number;
    postTokens: number;
    summary: string;
}
export const compact = new RequestType<CompactParams, CompactResult, void>("ctx/compact");

export interface MemoryFile {
    path: string;
    kind: string;
    tokens: number;
    status: string;
}
export interface PendingRule {
    path: string;
    paths: string[];
}
export interface ContextResult {
    usage: Usage;
    memoryFiles: MemoryFile[];
    pendingRules: PendingRule[];
}
export const context = new RequestType<SessionParams, ContextResult, void>("ctx/context");

export interface SetAutoCompactWindowParams {
    model: string;
    window: number | "auto";
}
export interface SetAutoCompactWindowResult {
    window: number;
}
export const setAutoCompactWindow = new RequestType<SetAutoCompactWindowParams, SetAutoCompactWindowResult, void>(
    "ctx/setAutoCompactWindow",
);

export const clear = new RequestType<SessionParams, SessionParams, void>("ctx/clear");

export interface AssembleParams {
    sessionId: string;
    /** The host's own system blocks. */
    system: unknown[];
    tools: unknown[];
    maxTokens: number;
    fork?: { instruction: string; skipCacheWrite?: boolean };
}
export interface AssembleResult {
    /** A body valid for the Anthropic Messages API. */
    request: Record<string, unknown>;
    usage: Usage;
    /** Which valves acted. */
    applied: unknown[];
}
export const assemble = new RequestType<AssembleParams, AssembleResult, void>("ctx/assemble");

// ---------------------------------------------------------------------------------
// Notifications (ctxd -> client)

export interface UsageChangedParams {
    sessionId: string;
    usage: Usage;
}
export const usageChanged = new NotificationType<UsageChangedParams>("ctx/usageChanged");

export interface CompactedParams {
    sessionId: string;
    trigger: string;
    preTokens: number;
    postTokens: number;
}
export const compacted = new NotificationType<CompactedParams>("ctx/compacted");

export interface CompactFailedParams {
    sessionId: string;
    reason: string;
}
export const compactFailed = new NotificationType<CompactFailedParams>("ctx/compactFailed");

export interface ContextChangedParams {
    sessionId: string;
    paths: string[];
}
export const contextChanged = new NotificationType<ContextChangedParams>("ctx/contextChanged");

// ---------------------------------------------------------------------------------
// Error codes (JSON-RPC standard ones and ctxd's own, see `error_codes` in the proto crate)

export const ErrorCodes = {
    MethodNotFound: -32601,
    InvalidParams: -32602,
    UnknownSession: -33001,
    Store: -33002,
    StoreLocked: -33003,
    InvalidRecord: -33004,
    Internal: -33005,
    MessageTooLarge: -33006,
    SessionClosed: -33007,
} as const;
