/**
 * Everything the user sees about a session, as pure functions of the daemon's usage
 * object (and of the `ctx/context` answer). No thresholds are recomputed here: the
 * daemon already says the level, the percentages and the tokens left; these functions
 * only format them.
 *
 * The Neovim client has the same functions in `lua/ctxd/render.lua`; both are checked
 * against `editor-clients/fixtures/render-cases.json`, so the two editors show the same
 * strings for the same usage.
 */
import type {
    ContextResult,
    InstantCompactionStats,
    Level,
    PromptCache,
    SetAutoCompactWindowResult,
    Usage,
    WindowSource,
} from "./lsp_ext";

/** A label and its formatted value. */
export type Row = [string, string];

/** `50060` → `50,060`. */
export function formatCount(n: number): string {
    const digits = String(Math.trunc(n));
    return digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

/**
 * Short token counts: `999`, `16.9k`, `1.2M`. Rounds half up at the tenth with integer
 * arithmetic, so JavaScript and Lua agree on every input.
 */
export function formatTokens(n: number): string {
    if (n < 1000) {
        return String(Math.trunc(n));
    }
    const tenthsOfK = Math.floor((n + 50) / 100);
    if (tenthsOfK < 10000) {
        return `${Math.floor(tenthsOfK / 10)}.${tenthsOfK % 10}k`;
    }
    const tenthsOfM = Math.floor((n + 50000) / 100000);
    return `${Math.floor(tenthsOfM / 10)}.${tenthsOfM % 10}M`;
}

function percent(p: number): string {
    return p.toFixed(1);
}

/** The status text shared by both editors, e.g. `ctx 50.1% · 16.9k to compact`. */
export function statusText(usage: Usage): string {
    const used = `ctx ${percent(usage.percentUsed)}%`;
    switch (usage.level) {
        case "compacting":
            return `${used} · compacting`;
        case "blocked":
            return `${used} · blocked`;
        case "ok":
        case "warning":
            if (!usage.autoCompactEnabled) {
                return `${used} · auto-compact off`;
            }
            return `${used} · ${formatTokens(usage.tokensUntilCompact)} to compact`;
    }
}

/** `~$3.06`; under a cent, `<$0.01`. */
function dollars(usd: number): string {
    return usd < 0.005 ? "<$0.01" : `~$${usd.toFixed(2)}`;
}

/**
 * What a cold prompt cache costs and the fix, as `ctxd statusline` says it:
 * `cache cold: next turn re-writes 612.0k tokens (~$3.06); /compact is instant (summary ready)`.
 * Empty while the cache is warm (the daemon says when that ends; no countdown here).
 */
export function cacheText(cache: PromptCache | null | undefined): string {
    if (cache === undefined || cache === null || cache.warm) {
        return "";
    }
    let text = "cache cold";
    if (cache.recacheTokens !== undefined && cache.recacheTokens !== null) {
        text += `: next turn re-writes ${formatTokens(cache.recacheTokens)} tokens`;
        if (cache.recacheCostUsd !== undefined && cache.recacheCostUsd !== null) {
            text += ` (${dollars(cache.recacheCostUsd)})`;
        }
    }
    return cache.summaryReady === true ? `${text}; /compact is instant (summary ready)` : text;
}

/** Codicon shown before the status text; the compacting one spins. */
export function levelIcon(level: Level): string {
    switch (level) {
        case "ok":
            return "$(dashboard)";
        case "warning":
            return "$(warning)";
        case "compacting":
            return "$(sync~spin)";
        case "blocked":
            return "$(error)";
    }
}

/**
 * Theme colour id for the status bar item's background. VS Code only honours the
 * warning and error backgrounds there, so `ok` has none.
 */
export function levelBackground(level: Level): string | undefined {
    switch (level) {
        case "ok":
            return undefined;
        case "warning":
        case "compacting":
            return "statusBarItem.warningBackground";
        case "blocked":
            return "statusBarItem.errorBackground";
    }
}

/** The whole status bar label: icon and text. */
export function statusBarText(usage: Usage): string {
    return `${levelIcon(usage.level)} ${statusText(usage)}`;
}

/** Levels, window and threshold, one row each. */
export function summaryRows(usage: Usage): Row[] {
    const autoCompactAt = usage.autoCompactEnabled
        ? formatCount(usage.threshold)
        : `${formatCount(usage.threshold)} (auto-compact off)`;
    return [
        ["Level", usage.level],
        [
            "Tokens",
            `${formatCount(usage.tokens)} (reported ${formatCount(usage.reportedTokens)}, estimated ${formatCount(usage.estimatedTokens)})`,
        ],
        ["Used", `${percent(usage.percentUsed)}% of the window`],
        [
            "Window",
            `${formatCount(usage.window)} (effective ${formatCount(usage.effectiveWindow)})`,
        ],
        ["Warning at", formatCount(usage.warning)],
        ["Auto-compact at", autoCompactAt],
        ["Blocked at", formatCount(usage.blocked)],
        // With auto-compact off nothing compacts at the threshold: no count-down to show.
        [
            "Until compaction",
            usage.autoCompactEnabled
                ? `${formatCount(usage.tokensUntilCompact)} (${percent(usage.percentUntilCompact)}%)`
                : "none (auto-compact off)",
        ],
    ];
}

/** Where the tokens go, one row per category. */
export function breakdownRows(usage: Usage): Row[] {
    const b = usage.breakdown;
    const rows: [string, number][] = [
        ["System prompt", b.systemPrompt],
        ["Tools", b.tools],
        ["Memory files", b.memoryFiles],
        ["Skills", b.skills],
        ["Messages: tool results", b.messages.toolResults],
        ["Messages: summaries", b.messages.summaries],
        ["Messages: other", b.messages.other],
        ["Free space", b.freeSpace],
        ["Autocompact buffer", b.autocompactBuffer],
    ];
    return rows.map(([label, tokens]) => [label, formatCount(tokens)]);
}

/** Memory files as `[path, kind, tokens, status]`. */
export function memoryFileRows(
    context: Pick<ContextResult, "memoryFiles">,
): [string, string, string, string][] {
    return context.memoryFiles.map((f) => [f.path, f.kind, formatCount(f.tokens), f.status]);
}

/** Rules waiting for a matching path, as `[path, globs]`. */
export function pendingRuleRows(context: Pick<ContextResult, "pendingRules">): Row[] {
    return context.pendingRules.map((r) => [r.path, r.paths.join(", ")]);
}

/** Read files and git, one row each. */
export function contextRows(
    context: Pick<ContextResult, "filesRead" | "staleFiles" | "git">,
): Row[] {
    return [
        ["Files read", formatCount(context.filesRead)],
        ["Changed since read", formatCount(context.staleFiles?.length ?? 0)],
        ["Git snapshot", context.git ? "yes" : "no"],
    ];
}

/**
 * Dollars as `ctxd claude stats` writes them: `$1.20`, `<$0.01` under half a cent.
 * Rounded to whole cents with integer arithmetic, so JavaScript and Lua agree.
 */
export function formatUsd(usd: number): string {
    if (usd > 0 && usd < 0.005) {
        return "<$0.01";
    }
    const cents = Math.floor(Math.max(usd, 0) * 100 + 0.5);
    return `$${Math.floor(cents / 100)}.${String(cents % 100).padStart(2, "0")}`;
}

/** A Claude Code session's instant compaction in one line: `prepared 2× $0.41 · saved 1 compaction ~$1.20`. */
export function instantCompactionText(stats: InstantCompactionStats): string {
    const compactions = stats.instantCompactions === 1 ? "compaction" : "compactions";
    return `prepared ${stats.preparations}× ${formatUsd(stats.preparationUsd)} · saved ${stats.instantCompactions} ${compactions} ~${formatUsd(stats.savedUsd)}`;
}

const WINDOW_SOURCES: Record<WindowSource, string> = {
    env: "CLAUDE_CODE_AUTO_COMPACT_WINDOW overrides saved windows",
    setting: "from settings",
    client: "from the editor's initializationOptions",
    experiment: "from an experiment",
    modelDefault: "the model's own window",
    subagentCeiling: "held to the subagent ceiling",
};

/**
 * What `ctx/setAutoCompactWindow` answered, in one sentence: the window now in force and
 * where it comes from (its `warnings` are shown on their own).
 */
export function windowResultText(result: SetAutoCompactWindowResult): string {
    const source = WINDOW_SOURCES[result.source] ?? result.source;
    return `ctxd: auto-compact window for ${result.model} is ${formatCount(result.window)} tokens (${source}).`;
}

/** Why the window in force is not the one asked for (the answer's `reason`). */
export function windowReasonText(result: SetAutoCompactWindowResult): string {
    return `ctxd: window ${formatCount(result.window)}, not ${formatCount(result.requested ?? result.window)}: ${result.reason ?? ""}.`;
}

function escapeMarkdown(text: string): string {
    return text.replace(/[\\`*_[\]|<>]/g, "\\$&");
}

function markdownTable(header: string[], rows: string[][]): string[] {
    const line = (cells: string[]) => `| ${cells.join(" | ")} |`;
    return [
        line(header),
        line(header.map(() => "---")),
        ...rows.map((r) => line(r.map(escapeMarkdown))),
    ];
}

/** Markdown for the status bar tooltip: summary, then the breakdown. */
export function statusTooltip(sessionId: string, usage: Usage): string {
    const cache = cacheText(usage.cache);
    return [
        `**ctxd session** \`${sessionId}\``,
        "",
        ...(cache !== "" ? [`**${cache}**`, ""] : []),
        ...markdownTable(["", ""], summaryRows(usage)),
        "",
        "**Breakdown**",
        "",
        ...markdownTable(["Category", "Tokens"], breakdownRows(usage)),
        "",
        "Click for the full context view.",
    ].join("\n");
}

/** What the context view shows: the `ctx/context` answer, or only a usage. */
export type ContextContent = { usage: Usage } & Partial<Omit<ContextResult, "usage" | "sessionId">>;

/**
 * The context view's document (markdown). `context` is the `ctx/context` answer, or
 * only a usage when the daemon does not have `ctx/context`; `note` says so.
 */
export function contextDocument(sessionId: string, context: ContextContent, note?: string): string {
    const lines = [`# ctxd context: ${sessionId}`, ""];
    if (note !== undefined) {
        lines.push(`> ${note}`, "");
    }
    lines.push(`**${statusText(context.usage)}**`, "");
    lines.push(...markdownTable(["", ""], summaryRows(context.usage)), "");
    lines.push(
        "## Breakdown",
        "",
        ...markdownTable(["Category", "Tokens"], breakdownRows(context.usage)),
        "",
    );
    if (context.instantCompaction !== undefined && context.instantCompaction !== null) {
        lines.push(
            "## Instant compaction",
            "",
            instantCompactionText(context.instantCompaction),
            "",
        );
    }
    if (context.memoryFiles !== undefined) {
        lines.push("## Memory files", "");
        if (context.memoryFiles.length === 0) {
            lines.push("None loaded.", "");
        } else {
            lines.push(
                ...markdownTable(
                    ["Path", "Kind", "Tokens", "Status"],
                    memoryFileRows({ memoryFiles: context.memoryFiles }),
                ),
                "",
            );
        }
    }
    if (context.pendingRules !== undefined && context.pendingRules.length > 0) {
        lines.push(
            "## Pending rules",
            "",
            ...markdownTable(
                ["Rule", "Applies to"],
                pendingRuleRows({ pendingRules: context.pendingRules }),
            ),
            "",
        );
    }
    if (context.filesRead !== undefined && context.git !== undefined) {
        const rows = contextRows({
            filesRead: context.filesRead,
            staleFiles: context.staleFiles,
            git: context.git,
        });
        lines.push("## Files and git", "", ...markdownTable(["", ""], rows), "");
    }
    if (context.staleFiles !== undefined && context.staleFiles.length > 0) {
        lines.push(
            "## Changed since read",
            "",
            ...context.staleFiles.map((f) => `- ${escapeMarkdown(f)}`),
            "",
        );
    }
    if (context.diagnostics !== undefined && context.diagnostics.length > 0) {
        lines.push(
            "## Problems",
            "",
            ...context.diagnostics.map((d) => `- ${escapeMarkdown(d)}`),
            "",
        );
    }
    return lines.join("\n");
}

/** The status bar label while the daemon is down (no usage to show). */
export const DAEMON_DOWN_TEXT = "$(debug-disconnect) ctxd restarting";
