/**
 * The ctxd protocol as TypeScript types: every `ctx/` request and notification this
 * client uses, in one file.
 *
 * This file mirrors `daemon/proto/src/lib.rs` and `settings.rs` (field truth:
 * `schemas/*.json`) by hand. `test/protocol.test.ts` fails when a field named in the
 * schemas is missing here, when an error code differs from the proto crate's, and when
 * the running daemon announces a method or notification not declared here or does not
 * announce one declared here. A daemon older than a method answers it with JSON-RPC
 * error -32601, which the callers turn into a readable message (see `errors.ts`).
 *
 * It imports only `vscode-jsonrpc`, never `vscode`, so the tests can load it in Node.
 */
import { NotificationType, RequestType } from "vscode-jsonrpc";
import type {
    ClaudeCompactResult,
    ClaudeSessionParams,
    ClaudeUndoResult,
    ReadHistoryParams,
    ReadHistoryResult,
    SearchHistoryParams,
    SearchHistoryResult,
    CompactOrigin,
    Decision,
    InstantCompactionStats,
    MemoryKind,
    MemoryStatus,
    ProviderErrorAction,
    Stage,
    Summarizer,
    SummaryPath,
    Trigger,
    WindowAdjustment,
    WindowSource,
} from "./protocol";

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
    /** The session's prompt cache, when the daemon knows it (a live Claude Code session). */
    cache?: PromptCache | null;
}

/** Whose figures a prompt cache state is. */
export type PromptCacheSource = "program" | "gateway";

/** Whether a session's prompt cache is warm and for how long, and what a cold turn re-writes. */
export interface PromptCache {
    warm: boolean;
    secondsLeft: number;
    /** RFC 3339. */
    expiresAt: string;
    ttlSeconds: number;
    recacheTokens?: number | null;
    recacheCostUsd?: number | null;
    /** The price table's date (YYYY-MM-DD), beside a price. */
    pricesDate?: string | null;
    source: PromptCacheSource;
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
    /** Set when the daemon runs with less than it should, and why (an index it cannot
     * write: a full disk or a read-only mount). */
    degraded?: string;
}

/** Who writes compaction summaries. */
export type ProviderKind = "anthropic" | "openai" | "offline";

/** Settings of one model (`modelSettings` of a settings file). */
export interface ModelSettings {
    autoCompactWindow?: number;
}

/** `gateway` in the settings: the gateway on the Messages API path (`ctxd gateway`). */
export interface GatewaySettings {
    /** Run the gateway inside the shared daemon too (default false). */
    enabled?: boolean;
    /** Default `127.0.0.1:8417`; loopback only. */
    listen?: string;
    /** Default `https://api.anthropic.com`. */
    upstream?: string;
    /** Prepare live sessions' summaries so Claude Code's compaction is answered at once (default true). */
    precompute?: boolean;
    /** Idle seconds before a session's summary is prepared (default 120). */
    precomputeIdleSeconds?: number;
    /** Least context, in percent of Claude Code's auto-compact threshold (default 60). */
    precomputeAtPercent?: number;
}

/**
 * ctxd settings: the keys of a settings file (`schemas/settings.json`), as a client sends
 * them in `initializationOptions.settings` and `workspace/didChangeConfiguration`. Every
 * key is optional; the daemon reports unknown keys and keys of the wrong type in its log
 * and ignores them.
 */
export interface Settings {
    /** Context window (tokens, 100,000 to 1,000,000; clamped with a warning) for every model. */
    autoCompactWindow?: number;
    autoCompactEnabled?: boolean;
    idleCompaction?: boolean;
    idleCompactAfterSeconds?: number;
    /** Per-model settings, keyed by model id. */
    modelSettings?: Record<string, ModelSettings>;
    /** Hook commands. Read from settings files only: the daemon ignores them from a client. */
    hooks?: Record<string, unknown[]>;
    provider?: ProviderKind;
    model?: string;
    compactModel?: string;
    largerModelRetry?: string;
    /** Ask for the summary with the cache-sharing fork first (default true). */
    compactFork?: boolean;
    baseUrl?: string;
    /** Name of the environment variable holding the API key (never the key itself). */
    apiKeyEnv?: string;
    memoryFileNames?: string[];
    /** Follow running Claude Code sessions under `~/.claude/projects`. */
    observeClaudeProjects?: boolean;
    /** Compact an idle, observed Claude Code session in place (default false). */
    claudeIdleCompaction?: boolean;
    /** Seconds a Claude Code session must be idle first (default 600). */
    claudeIdleCompactAfterSeconds?: number;
    /** Share of the compact threshold, in percent, it must stand above (default 60). */
    claudeIdleCompactPercent?: number;
    /** Folders whose own settings files may choose the provider, URL, key variable,
     * hooks and import folders (user or client settings only). */
    trustedFolders?: string[];
    /** Folders memory-file `@imports` may read besides the project and `~/.claude`. */
    importFolders?: string[];
    /** The gateway (user or client settings only: it chooses where API keys go). */
    gateway?: GatewaySettings;
}

/** `initializationOptions` of `initialize`. */
export interface InitializationOptions {
    stateDir?: string;
    /** Client data: the window the client wants (below env and settings files). */
    autoCompactWindow?: number;
    settings?: Settings;
}

export interface SessionParams {
    sessionId: string;
}

// ---------------------------------------------------------------------------------
// Requests the daemon answers today

export interface OpenSessionParams {
    cwd: string;
    model: string;
    /** Resume this session when it is in the store; create it with this id otherwise. */
    sessionId?: string;
    /** Path of a Claude Code transcript to import as this new session. */
    import?: string;
    /** A subagent's own settings; its window only ever lowers the parent's. */
    agent?: AgentSettings;
}
export interface AgentSettings {
    name?: string;
    autoCompactWindow?: number;
}
export interface OpenSessionResult {
    sessionId: string;
    resumed: boolean;
    records: number;
    diagnostics?: string[];
    usage: Usage;
}
/**
 * Opens (or resumes) a session. The daemon also pushes `ctx/usageChanged` for it, which
 * may arrive before this answer. A session in the store that is not open (after a
 * daemon restart or `ctx/closeSession`) is resumed on its first use by id anyway; only
 * an id the store never had gives -33001.
 */
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

/** A window in tokens, or `"auto"` to clear the saved one. */
export type WindowChoice = number | "auto";

export interface SetAutoCompactWindowParams {
    model: string;
    window: WindowChoice;
}
/** Where a window came from. */
export type { CompactOrigin, WindowSource };
export interface SetAutoCompactWindowResult {
    model: string;
    /** The window now in force for the model (outside any project's settings). */
    window: number;
    source: WindowSource;
    /** Problems with the value (clamped into range, above the model's window, …). */
    warnings?: string[];
    /** The window asked for (absent for `"auto"`). */
    requested?: number;
    /** The model's own window. */
    modelWindow: number;
    /** How the window in force differs from the one asked for. */
    adjustment?: WindowAdjustment;
    /** Why, to show as it is. */
    reason?: string;
}
/**
 * Saves the window for a model (`"auto"` clears it); the model's open sessions take it
 * at once and push `ctx/usageChanged`. A window that is neither a count nor `"auto"` is
 * error -32602.
 */
export const setAutoCompactWindow = new RequestType<SetAutoCompactWindowParams, SetAutoCompactWindowResult, void>(
    "ctx/setAutoCompactWindow",
);

export interface FileReadParams {
    sessionId: string;
    /** Absolute path (a relative one is error -32602). */
    path: string;
    /** First line read, 1-based (default 1). */
    startLine?: number;
    /** Lines read (default: to the end). */
    numLines?: number;
}
export interface FileReadResult {
    path: string;
    /** The path was read before in this session. */
    alreadyRead: boolean;
    /** Read before, and the same lines had the same content then. */
    unchanged: boolean;
    reads: number;
    startLine: number;
    numLines: number;
    totalLines?: number;
    /** Estimated tokens of the text read. */
    tokens: number;
}
/** The agent read a file by some means ctxd does not see in the transcript. */
export const fileRead = new RequestType<FileReadParams, FileReadResult, void>("ctx/fileRead");

/** `waiting`: a rule or nested file not activated yet; `duplicate`: the same text loaded elsewhere. */
export type MemoryFileStatus = MemoryStatus;
export interface MemoryFile {
    path: string;
    /** managed, user, project, local, rule, nested, auto memory or import. */
    kind: MemoryKind;
    tokens: number;
    status: MemoryFileStatus;
}
/** A rule waiting for a read that matches its `paths:` globs. */
export interface PendingRule {
    path: string;
    paths: string[];
}
export interface ContextResult {
    sessionId: string;
    /** The usage, with `breakdown.memoryFiles` filled in (it is 0 in `ctx/usageChanged`). */
    usage: Usage;
    /** In the order the model sees them. */
    memoryFiles: MemoryFile[];
    pendingRules: PendingRule[];
    /** Problems with memory files (unreadable, not UTF-8, import cycles, …). */
    diagnostics?: string[];
    filesRead: number;
    /** Read files that changed on disk since they were read. */
    staleFiles?: string[];
    /** Whether a git snapshot is part of the system context. */
    git: boolean;
    /** A summary prepared ahead of the threshold is ready: tokens right after installing it. */
    preparedAhead?: number;
    /** A Claude Code session on ctxd's gateway: what preparing cost and answering at once saved. */
    instantCompaction?: InstantCompactionStats;
}
/** What the model sees, by source. */
export const context = new RequestType<SessionParams, ContextResult, void>("ctx/context");

export interface CompactParams {
    sessionId: string;
    /** Focus instructions for the summary (what it must keep). */
    instructions?: string;
    /** Partial: summarize from this record (uuid) on, keeping what precedes it. */
    from?: string;
    /** Partial: summarize up to this record (uuid), keeping what follows it. */
    upTo?: string;
    /** LSP work-done token: the phases come as `$/progress` (begin, reports, end). */
    workDoneToken?: number | string;
}
export interface CompactResult {
    /** Uuid of the compact boundary record. */
    boundary: string;
    /** `manual` for this request. */
    trigger: Trigger;
    preTokens: number;
    postTokens: number;
    /** The summary the model continues from. */
    summary: string;
    /** Who wrote it: `offline`, `anthropic`, `openai`. */
    summarizer: Summarizer;
    /**
     * Which request a provider wrote it for: `fork` (the cache-sharing fork of the
     * session's request) or `fallback` (the summary-specific request). Absent when the
     * offline summarizer wrote it.
     */
    summaryPath?: SummaryPath;
    /** Items the summary missed (user messages, files, todos) that ctxd appended. */
    fidelityAppended: number;
    /** Hook failures and other problems that did not stop the compaction. */
    problems?: string[];
    /**
     * Which compaction this answer reports: `requested` (this request's), `joined` (one
     * already running, which it waited for) or `queued` (it ran after the running one,
     * with its own focus instructions). Absent means `requested`.
     */
    origin?: CompactOrigin;
    /** The usage after the compaction. */
    usage: Usage;
}
/**
 * Compacts a session now; answered once the compaction is installed. The daemon also
 * sends `ctx/compacted` (trigger `manual`) and pushes the new usage. Sent while one
 * runs, it waits for it (`origin: joined`) or runs next (`queued`). Errors: -33009 (the compaction failed, e.g.
 * nothing to compact; nothing was installed).
 */
export const compact = new RequestType<CompactParams, CompactResult, void>("ctx/compact");

export type UndoCompactParams = SessionParams;
export interface UndoCompactResult {
    /** Uuid of the compact boundary that was undone. */
    boundary: string;
    /** Uuid of the undo record appended to the transcript. */
    undoRecord: string;
    /** Tokens of the next request before the undo (the compacted view). */
    preTokens: number;
    /** Tokens of the next request now (the restored view). */
    postTokens: number;
    usage: Usage;
}
/**
 * Takes back the session's latest compaction: the model sees the conversation it
 * replaced again (the transcript keeps both and gains an undo record), and the daemon
 * pushes the new usage. Errors: -33010 (`data.reason` `nothingToUndo`, or `newTurnSince`
 * when a new turn followed the compaction; nothing was appended), -33008 (a compaction of
 * the session is running).
 */
export const undoCompact = new RequestType<UndoCompactParams, UndoCompactResult, void>("ctx/undoCompact");

export interface ClearResult {
    /** The new, empty session (same working directory and model). */
    sessionId: string;
    usage: Usage;
}
/** Closes the session and starts a new, empty one in its place (like `/clear`). */
export const clear = new RequestType<SessionParams, ClearResult, void>("ctx/clear");

/** The provider's error as the host received it. */
export interface ProviderErrorReport {
    /** HTTP status, when known. */
    status?: number;
    /** The provider's error type (e.g. `invalid_request_error`), when known. */
    type?: string;
    message: string;
}
export interface ReportProviderErrorParams {
    sessionId: string;
    error: ProviderErrorReport;
}
export interface ReportProviderErrorResult {
    /** `compacted` (retry the request now) or `none` (not a refusal compaction answers, or compaction is off). */
    action: ProviderErrorAction;
    /** Why, in a sentence. */
    reason: string;
    compact?: CompactResult;
}
/**
 * The host's model request failed: ctxd compacts (trigger `reactive`) when the refusal
 * is one compaction answers (prompt too long, long-context credits).
 */
export const reportProviderError = new RequestType<ReportProviderErrorParams, ReportProviderErrorResult, void>(
    "ctx/reportProviderError",
);

/** Records to take out of what the model sees (the transcript keeps them). */
export interface SnipParams {
    sessionId: string;
    uuids: string[];
}
export interface SnipResult {
    /** Estimated tokens the next request no longer carries. */
    tokensFreed: number;
    /** Uuids that name no record in the current view (ignored). */
    unknown?: string[];
    usage: Usage;
}
/** Removes records from the model's view; tool pairs and tool references are protected. */
export const snip = new RequestType<SnipParams, SnipResult, void>("ctx/snip");

/** A span to replace with its summary at read time. */
export interface CollapseParams {
    sessionId: string;
    from: string;
    to: string;
    /** Written by the daemon's offline summarizer when absent. */
    summary?: string;
}
export interface CollapseResult {
    /** Uuid of the collapse record. */
    collapseId: string;
    tokensFreed: number;
    usage: Usage;
}
/** Replaces the span `from`..`to` with a summary in what the model sees. */
export const collapse = new RequestType<CollapseParams, CollapseResult, void>("ctx/collapse");

/** A transcript another program (Claude Code) writes, to follow. */
export interface ObserveParams {
    /** Absolute path of the transcript (JSONL). */
    transcript?: string;
    /** Or a Claude Code project directory: its newest transcript, and each new one. */
    projectDir?: string;
}
export interface ObserveResult {
    /** The id its `ctx/usageChanged` notifications carry. */
    sessionId: string;
    usage: Usage;
}
/** Follows a running Claude Code session's transcript and publishes its usage. */
export const observe = new RequestType<ObserveParams, ObserveResult, void>("ctx/observe");

export type { ClaudeCompactResult, ClaudeSessionParams, ClaudeUndoResult } from "./protocol";
export type { InstantCompactionStats } from "./protocol";
export type {
    HistoryHit,
    HistoryRecord,
    HistoryRole,
    ReadHistoryParams,
    ReadHistoryResult,
    SearchHistoryParams,
    SearchHistoryResult,
} from "./protocol";
/** Compacts a Claude Code transcript in place, in the program's own record shapes. */
export const claudeCompact = new RequestType<ClaudeSessionParams, ClaudeCompactResult, void>("ctx/claudeCompact");
/** Takes ctxd's last compaction of a Claude Code transcript back, byte for byte. */
export const claudeUndo = new RequestType<ClaudeSessionParams, ClaudeUndoResult, void>("ctx/claudeUndo");
/** Searches a session's history (its compacted past included), or every session of a project. */
export const searchHistory = new RequestType<SearchHistoryParams, SearchHistoryResult, void>("ctx/searchHistory");
/** One record of a session's history in full, with its neighbours on the chain. */
export const readHistory = new RequestType<ReadHistoryParams, ReadHistoryResult, void>("ctx/readHistory");

/** A skill ran and the model was given `content` (restored after a compaction). */
export interface SkillInvokedParams {
    sessionId: string;
    name: string;
    content: string;
}
export const skillInvoked = new RequestType<SkillInvokedParams, UsageResult, void>("ctx/skillInvoked");

/** The session's plan file, read again from disk after a compaction (null forgets it). */
export interface SetPlanParams {
    sessionId: string;
    path?: string | null;
}
export const setPlan = new RequestType<SetPlanParams, UsageResult, void>("ctx/setPlan");

/** A side request that shares the session's prefix. */
export interface ForkParams {
    instruction: string;
    /** Mark the end of the shared prefix instead of the final message. */
    skipCacheWrite?: boolean;
}
export interface AssembleParams {
    sessionId: string;
    /** The host's own system blocks (Messages API text blocks; default none). */
    system?: unknown[];
    /** The tools offered (Messages API tool objects; default none). */
    tools?: unknown[];
    maxTokens: number;
    /** The host's extended-thinking settings (the Messages API `thinking` object), sent on in `request` and kept by compaction's fork. */
    thinking?: Record<string, unknown>;
    fork?: ForkParams;
    /** Also return `scrollback`, the full conversation with markers of what the model no longer sees. */
    includeSnipped?: boolean;
    /** The `revision` of the latest answer, whose request the host kept: then `request.messages` holds only the messages from `messagesFrom` on. */
    since?: string;
}
/** What one stage of the request pipeline did. */
export interface AppliedStage {
    stage: Stage;
    acted: boolean;
    tokensFreed: number;
    detail?: string;
}
export interface AssembleResult {
    /** A body for the Anthropic Messages API: model, system, messages, tools, max_tokens. */
    request: Record<string, unknown>;
    /** Names this answer's request, for the next assemble's `since`. */
    revision: string;
    /** How many leading messages of the `since` request this one shares (0: `request` is whole). */
    messagesFrom: number;
    /** Estimated input tokens of exactly this request. */
    requestTokens: number;
    usage: Usage;
    /** One entry per pipeline stage, in order. */
    applied: AppliedStage[];
    /** `continue`, or `compact` when the threshold is reached (an automatic compaction started in the background). */
    decision: Decision;
    /** With `includeSnipped`: the whole conversation since the latest boundary, each message marked with why the model does not see it. */
    scrollback?: Scrollback;
}
/** Every message of the active chain since the latest compact boundary, in view order. */
export interface Scrollback {
    entries: ScrollbackEntry[];
    /** The latest compact boundary. */
    boundaryUuid?: string;
    /** Message records on branches the host rewound away from: counted, not listed. */
    offChain: number;
}
export interface ScrollbackEntry {
    /** None for a collapse summary, which has no record of its own. */
    uuid?: string;
    parentUuid?: string;
    role: "user" | "assistant";
    kind: "prompt" | "toolResults" | "meta" | "compactSummary" | "attachment" | "response" | "collapseSummary";
    /** `attachment.type` of an attachment. */
    attachmentType?: string;
    /** Milliseconds since the Unix epoch. */
    timestampMs?: number;
    /** Content blocks as the transcript has them. */
    content: unknown[];
    /** Estimated tokens of the content as written. */
    tokens: number;
    /** Why the model does not see this message; absent when it does. */
    hidden?: { reason: "compacted"; boundaryUuid?: string | null } | { reason: "snipped" } | { reason: "collapsed"; summaryEntry: number };
    /** Tool results of this message that the model sees changed, or not at all. */
    results?: ResultMark[];
    /** For a collapse summary: the first and last record of the span it stands for. */
    span?: { from: string; to: string };
}
/** A tool result whose content the model sees changed. */
export interface ResultMark {
    toolUseId: string;
    /** Index of the `tool_result` block in `content`. */
    block: number;
    change: { kind: "cleared" } | { kind: "deletedFromCache" } | { kind: "replaced"; path: string; originalBytes: number };
}
/** Builds the session's next model request. */
export const assemble = new RequestType<AssembleParams, AssembleResult, void>("ctx/assemble");

// ---------------------------------------------------------------------------------
// Notifications (ctxd -> client)

export interface UsageChangedParams {
    sessionId: string;
    usage: Usage;
}
export const usageChanged = new NotificationType<UsageChangedParams>("ctx/usageChanged");

export interface ContextChangedParams {
    sessionId: string;
    /** The memory files or read files that changed on disk. */
    paths: string[];
}
/** Memory files or files the agent read changed on disk; `ctx/context` has the new state. */
export const contextChanged = new NotificationType<ContextChangedParams>("ctx/contextChanged");

export interface CompactedParams {
    sessionId: string;
    /** `manual` (ctx/compact), `auto` (the threshold was reached), `reactive` (ctx/reportProviderError), … */
    trigger: Trigger;
    preTokens: number;
    postTokens: number;
}
/** A compaction of the session was installed. */
export const compacted = new NotificationType<CompactedParams>("ctx/compacted");

export interface CompactFailedParams {
    sessionId: string;
    /** Why; begins `Autocompact is thrashing` when automatic compaction stopped for that. */
    reason: string;
}
/** An automatic compaction failed, or automatic compaction stopped (circuit breaker). */
export const compactFailed = new NotificationType<CompactFailedParams>("ctx/compactFailed");

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
    /** The session is busy with something that excludes the request (a compaction). */
    Busy: -33008,
    /** A compaction failed; nothing was installed. */
    CompactFailed: -33009,
    /** `ctx/undoCompact` was refused (`data.reason`: `nothingToUndo`, `newTurnSince`). */
    CannotUndo: -33010,
} as const;
