/**
 * The ctxd protocol for this client, in one module: everything `protocol.ts` generates
 * from `schemas/` (each type, and a vscode-jsonrpc `RequestType` or `NotificationType`
 * per method: `openSession`, `usageChanged`, …), and what the schemas do not describe,
 * below. `test/protocol.test.ts` fails when `protocol.ts` is not what the generator
 * writes from the schemas, when an error code differs from the proto crate's, and when
 * the running daemon announces a method the generated constants lack or the reverse. A
 * daemon older than a method answers it with JSON-RPC error -32601, which the callers
 * turn into a readable message (see `errors.ts`).
 *
 * It imports only `vscode-jsonrpc`, never `vscode`, so the tests can load it in Node.
 */
import type { AppendParams } from "./protocol";

export * from "./protocol";

/** A transcript record: one line of a Claude Code style JSONL transcript. */
export type TranscriptRecord = AppendParams["records"][number];

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
    /** `ctx/undoCompact` was refused (its `data` is a `CannotUndoData`), or `ctx/claudeUndo` found nothing of ctxd's to undo. */
    CannotUndo: -33010,
} as const;
