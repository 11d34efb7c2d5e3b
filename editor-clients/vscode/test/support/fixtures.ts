/** The rendering cases shared with the Neovim client, and the daemon's JSON Schemas. */
import * as fs from "node:fs";
import * as path from "node:path";

import type {
    ContextResult,
    InstantCompactionStats,
    PromptCache,
    SetAutoCompactWindowResult,
    Usage,
} from "../../src/lsp_ext";
import { packageRoot } from "./daemon";

export interface UsageCase {
    name: string;
    usage: Usage;
    statusText: string;
    summaryRows: [string, string][];
    breakdownRows: [string, string][];
}

export interface RenderCases {
    formatTokens: [number, string][];
    usageCases: UsageCase[];
    contextCase: {
        context: ContextResult;
        memoryFileRows: [string, string, string, string][];
        pendingRuleRows: [string, string][];
        contextRows: [string, string][];
        instantCompactionText: string;
    };
    /** A Claude Code session's instant-compaction figures and the context view's line for them. */
    instantCompactionCases: { stats: InstantCompactionStats; text: string }[];
    /** A `ctx/setAutoCompactWindow` answer and the message shown for it. */
    windowCases: { result: SetAutoCompactWindowResult; text: string }[];
    windowReasonCases: { result: SetAutoCompactWindowResult; text: string }[];
    /** Window prompt inputs and what they parse to (`null`: rejected). */
    windowInputs: [string, number | "auto" | null][];
    /** A prompt cache and what an observed session's status adds for it. */
    cacheCases: { name: string; cache: PromptCache; text: string }[];
}

export const renderCases: RenderCases = JSON.parse(
    fs.readFileSync(path.join(packageRoot, "../fixtures/render-cases.json"), "utf8"),
);

export function usageCase(level: Usage["level"]): UsageCase {
    const found = renderCases.usageCases.find((c) => c.usage.level === level);
    if (found === undefined) {
        throw new Error(`no render case at level ${level}`);
    }
    return found;
}

/** `schemas/<name>.json` of this checkout. */
export function schema(name: string): {
    properties: Record<string, unknown>;
    required?: string[];
    $defs?: Record<string, { properties: Record<string, unknown>; required?: string[] }>;
} {
    return JSON.parse(
        fs.readFileSync(path.join(packageRoot, "../../schemas", `${name}.json`), "utf8"),
    );
}
