/** Rendering is a pure function of the usage object; the cases are shared with Neovim. */
import * as assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
    breakdownRows,
    cacheText,
    contextDocument,
    contextRows,
    formatCount,
    formatTokens,
    instantCompactionText,
    levelBackground,
    levelIcon,
    memoryFileRows,
    pendingRuleRows,
    statusBarText,
    statusText,
    statusTooltip,
    summaryRows,
    windowReasonText,
    windowResultText,
} from "../src/render";
import { renderCases, usageCase } from "./support/fixtures";

describe("shared render cases", () => {
    it("formats token counts", () => {
        for (const [n, expected] of renderCases.formatTokens) {
            assert.equal(formatTokens(n), expected, `formatTokens(${n})`);
        }
    });

    for (const c of renderCases.usageCases) {
        it(`renders ${c.name}`, () => {
            assert.equal(statusText(c.usage), c.statusText);
            assert.deepEqual(summaryRows(c.usage), c.summaryRows);
            assert.deepEqual(breakdownRows(c.usage), c.breakdownRows);
        });
    }

    it("says what a cold cache costs and the fix", () => {
        assert.ok(renderCases.cacheCases.length > 0);
        for (const c of renderCases.cacheCases) {
            assert.equal(cacheText(c.cache), c.text, c.name);
        }
        assert.equal(cacheText(undefined), "");
        assert.equal(cacheText(null), "");
    });

    it("renders memory files and pending rules", () => {
        const { context, memoryFileRows: files, pendingRuleRows: rules } = renderCases.contextCase;
        assert.deepEqual(memoryFileRows(context), files);
        assert.deepEqual(pendingRuleRows(context), rules);
    });

    it("renders read files and git", () => {
        const { context, contextRows: rows } = renderCases.contextCase;
        assert.deepEqual(contextRows(context), rows);
        assert.deepEqual(contextRows({ filesRead: 0, git: false }), [
            ["Files read", "0"],
            ["Changed since read", "0"],
            ["Git snapshot", "no"],
        ]);
    });

    it("says what instant compaction cost and saved", () => {
        assert.ok(renderCases.instantCompactionCases.length > 0);
        for (const { stats, text } of renderCases.instantCompactionCases) {
            assert.equal(instantCompactionText(stats), text, JSON.stringify(stats));
        }
        const { context, instantCompactionText: line } = renderCases.contextCase;
        assert.ok(context.instantCompaction !== undefined && context.instantCompaction !== null);
        assert.equal(instantCompactionText(context.instantCompaction), line);
    });

    it("says which window is in force and where it comes from", () => {
        for (const { result, text } of renderCases.windowCases) {
            assert.equal(windowResultText(result), text, JSON.stringify(result));
        }
    });

    it("says why a window differs from the one asked for", () => {
        assert.ok(renderCases.windowReasonCases.length > 0);
        for (const { result, text } of renderCases.windowReasonCases) {
            assert.equal(windowReasonText(result), text, JSON.stringify(result));
        }
    });
});

describe("status bar rendering", () => {
    it("puts the level's icon before the shared text, spinning while compacting", () => {
        assert.equal(
            statusBarText(usageCase("ok").usage),
            `$(dashboard) ${usageCase("ok").statusText}`,
        );
        assert.equal(
            statusBarText(usageCase("compacting").usage),
            "$(sync~spin) ctx 85.0% · compacting",
        );
        assert.equal(levelIcon("warning"), "$(warning)");
        assert.equal(levelIcon("blocked"), "$(error)");
    });

    it("colours warning and compacting yellow, blocked red, ok not at all", () => {
        assert.equal(levelBackground("ok"), undefined);
        assert.equal(levelBackground("warning"), "statusBarItem.warningBackground");
        assert.equal(levelBackground("compacting"), "statusBarItem.warningBackground");
        assert.equal(levelBackground("blocked"), "statusBarItem.errorBackground");
    });

    it("lists window, threshold and breakdown in the tooltip", () => {
        const c = usageCase("warning");
        const tooltip = statusTooltip("s-1", c.usage);
        assert.match(tooltip, /\*\*ctxd session\*\* `s-1`/);
        assert.match(tooltip, /\| Window \| 100,000 \(effective 80,000\) \|/);
        assert.match(tooltip, /\| Auto-compact at \| 67,000 \|/);
        for (const [label, tokens] of c.breakdownRows) {
            assert.ok(tooltip.includes(`| ${label} | ${tokens} |`), `tooltip row ${label}`);
        }
    });

    it("formats counts with thousands separators", () => {
        assert.equal(formatCount(0), "0");
        assert.equal(formatCount(999), "999");
        assert.equal(formatCount(1000), "1,000");
        assert.equal(formatCount(1234567), "1,234,567");
    });
});

describe("context document", () => {
    it("shows memory files with their token sizes when ctx/context gives them", () => {
        const { context } = renderCases.contextCase;
        const doc = contextDocument("s-1", context);
        assert.match(doc, /^# ctxd context: s-1/);
        assert.doesNotMatch(doc, /^> /m, "no note");
        assert.match(doc, /\| Memory files \| 1,840 \|/, "the breakdown's memory-file line");
        assert.match(doc, /## Memory files/);
        assert.ok(doc.includes("| /home/dev/project/CLAUDE.md | project | 1,428 | loaded |"));
        assert.ok(
            doc.includes("| /home/dev/project/.claude/rules/rust.md | rule | 236 | waiting |"),
        );
        assert.match(doc, /## Pending rules/);
        assert.ok(
            doc.includes(
                "| /home/dev/project/.claude/rules/rust.md | src/\\*\\*/\\*.rs, daemon/\\*\\*/\\*.rs |",
            ),
        );
        assert.match(
            doc,
            /## Files and git\n\n\| {2}\| {2}\|\n\| --- \| --- \|\n\| Files read \| 3 \|\n\| Changed since read \| 1 \|\n\| Git snapshot \| yes \|/,
        );
        assert.match(doc, /## Changed since read\n\n- \/home\/dev\/project\/src\/lib\.rs\n/);
        assert.match(
            doc,
            /## Problems\n\n- \/home\/dev\/project\/CLAUDE\.md: @docs\/missing\.md: no such file\n/,
        );
        assert.ok(
            doc.includes(
                "## Instant compaction\n\nprepared 2× $0.41 · saved 1 compaction ~$1.20\n",
            ),
            doc,
        );
    });

    it("leaves out empty sections", () => {
        const { context } = renderCases.contextCase;
        const doc = contextDocument("s-1", {
            ...context,
            memoryFiles: [],
            pendingRules: [],
            staleFiles: undefined,
            diagnostics: [],
        });
        assert.match(doc, /## Memory files\n\nNone loaded\./);
        for (const heading of ["Pending rules", "Changed since read", "Problems"]) {
            assert.ok(!doc.includes(`## ${heading}`), heading);
        }
        assert.match(doc, /\| Changed since read \| 0 \|/);
        const without = contextDocument("s-1", { ...context, instantCompaction: undefined });
        assert.ok(
            !without.includes("Instant compaction"),
            "a session off the gateway has no such line",
        );
    });

    it("shows only the breakdown and a note when the daemon gave only a usage", () => {
        const doc = contextDocument("s-1", { usage: usageCase("ok").usage }, "no ctx/context yet");
        assert.match(doc, /> no ctx\/context yet/);
        assert.match(doc, /## Breakdown/);
        assert.doesNotMatch(doc, /## Memory files/);
        assert.doesNotMatch(doc, /## Files and git/);
    });
});
