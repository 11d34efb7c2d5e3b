/**
 * `src/lsp_ext.ts` mirrors the daemon's wire types by hand. These lists are checked
 * against the types at compile time (`satisfies`) and against `schemas/` at run time,
 * so a field added or renamed in the Rust types fails here until lsp_ext.ts follows.
 */
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";

import * as ext from "../src/lsp_ext";
import { renderCases, schema } from "./support/fixtures";
import { packageRoot, startDaemon, tempStateDir, type TestDaemon } from "./support/daemon";

type Keys<T> = { [K in keyof Required<T>]: true };

const usageKeys = {
    tokens: true, reportedTokens: true, estimatedTokens: true, window: true, effectiveWindow: true,
    threshold: true, warning: true, blocked: true, percentUsed: true, percentUntilCompact: true,
    tokensUntilCompact: true, level: true, autoCompactEnabled: true, breakdown: true, cache: true,
} satisfies Keys<ext.Usage>;
const promptCacheKeys = {
    warm: true, secondsLeft: true, expiresAt: true, ttlSeconds: true, recacheTokens: true, recacheCostUsd: true, pricesDate: true, source: true,
} satisfies Keys<ext.PromptCache>;
const breakdownKeys = {
    systemPrompt: true, tools: true, memoryFiles: true, skills: true, messages: true, freeSpace: true, autocompactBuffer: true,
} satisfies Keys<ext.Breakdown>;
const messageKeys = { toolResults: true, summaries: true, other: true } satisfies Keys<ext.MessageBreakdown>;
const openParamKeys = { cwd: true, model: true, sessionId: true, import: true, agent: true } satisfies Keys<ext.OpenSessionParams>;
const agentKeys = { name: true, autoCompactWindow: true } satisfies Keys<ext.AgentSettings>;
const skillInvokedKeys = { sessionId: true, name: true, content: true } satisfies Keys<ext.SkillInvokedParams>;
const setPlanKeys = { sessionId: true, path: true } satisfies Keys<ext.SetPlanParams>;
const openResultKeys = { sessionId: true, resumed: true, records: true, diagnostics: true, usage: true } satisfies Keys<ext.OpenSessionResult>;
const appendParamKeys = { sessionId: true, records: true } satisfies Keys<ext.AppendParams>;
const appendResultKeys = { appended: true, duplicates: true, records: true, usage: true } satisfies Keys<ext.AppendResult>;
const sessionParamKeys = { sessionId: true } satisfies Keys<ext.SessionParams>;
const usageResultKeys = { sessionId: true, usage: true } satisfies Keys<ext.UsageResult>;
const windowParamKeys = { model: true, window: true } satisfies Keys<ext.SetAutoCompactWindowParams>;
const windowResultKeys = { model: true, window: true, source: true, warnings: true, requested: true, modelWindow: true, adjustment: true, reason: true } satisfies Keys<ext.SetAutoCompactWindowResult>;
const fileReadParamKeys = { sessionId: true, path: true, startLine: true, numLines: true } satisfies Keys<ext.FileReadParams>;
const fileReadResultKeys = {
    path: true, alreadyRead: true, unchanged: true, reads: true, startLine: true, numLines: true, totalLines: true, tokens: true,
} satisfies Keys<ext.FileReadResult>;
const contextResultKeys = {
    sessionId: true, usage: true, memoryFiles: true, pendingRules: true, diagnostics: true, filesRead: true, staleFiles: true, git: true, preparedAhead: true,
    instantCompaction: true,
} satisfies Keys<ext.ContextResult>;
const instantCompactionKeys = {
    sessionId: true, model: true, preparations: true, preparationInputTokens: true, preparationCacheReadTokens: true,
    preparationCacheWriteTokens: true, preparationOutputTokens: true, preparationUsd: true, instantCompactions: true,
    savedCallUsd: true, savedColdRewriteUsd: true, savedUsd: true, netUsd: true,
} satisfies Keys<ext.InstantCompactionStats>;
const memoryFileKeys = { path: true, kind: true, tokens: true, status: true } satisfies Keys<ext.MemoryFile>;
const pendingRuleKeys = { path: true, paths: true } satisfies Keys<ext.PendingRule>;
const compactParamKeys = { sessionId: true, instructions: true, from: true, upTo: true, workDoneToken: true } satisfies Keys<ext.CompactParams>;
const compactResultKeys = {
    boundary: true, trigger: true, preTokens: true, postTokens: true, summary: true, summarizer: true, summaryPath: true, fidelityAppended: true,
    problems: true, origin: true, usage: true,
} satisfies Keys<ext.CompactResult>;
const undoCompactResultKeys = {
    boundary: true, undoRecord: true, preTokens: true, postTokens: true, usage: true,
} satisfies Keys<ext.UndoCompactResult>;
const compactedKeys = { sessionId: true, trigger: true, preTokens: true, postTokens: true } satisfies Keys<ext.CompactedParams>;
const compactFailedKeys = { sessionId: true, reason: true } satisfies Keys<ext.CompactFailedParams>;
const clearResultKeys = { sessionId: true, usage: true } satisfies Keys<ext.ClearResult>;
const providerErrorParamKeys = { sessionId: true, error: true } satisfies Keys<ext.ReportProviderErrorParams>;
const providerErrorKeys = { status: true, type: true, message: true } satisfies Keys<ext.ProviderErrorReport>;
const assembleParamKeys = { sessionId: true, system: true, tools: true, maxTokens: true, thinking: true, fork: true, includeSnipped: true, since: true } satisfies Keys<ext.AssembleParams>;
const forkKeys = { instruction: true, skipCacheWrite: true } satisfies Keys<ext.ForkParams>;
const assembleResultKeys = { request: true, revision: true, messagesFrom: true, requestTokens: true, usage: true, applied: true, decision: true, scrollback: true } satisfies Keys<ext.AssembleResult>;
const appliedStageKeys = { stage: true, acted: true, tokensFreed: true, detail: true } satisfies Keys<ext.AppliedStage>;
const scrollbackKeys = { entries: true, boundaryUuid: true, offChain: true } satisfies Keys<ext.Scrollback>;
const scrollbackEntryKeys = {
    uuid: true, parentUuid: true, role: true, kind: true, attachmentType: true, timestampMs: true, content: true, tokens: true, hidden: true, results: true, span: true,
} satisfies Keys<ext.ScrollbackEntry>;
const resultMarkKeys = { toolUseId: true, block: true, change: true } satisfies Keys<ext.ResultMark>;
const providerErrorResultKeys = { action: true, reason: true, compact: true } satisfies Keys<ext.ReportProviderErrorResult>;
const observeParamKeys = { transcript: true, projectDir: true } satisfies Keys<ext.ObserveParams>;
const observeResultKeys = { sessionId: true, usage: true } satisfies Keys<ext.ObserveResult>;
const snipParamKeys = { sessionId: true, uuids: true } satisfies Keys<ext.SnipParams>;
const snipResultKeys = { tokensFreed: true, unknown: true, usage: true } satisfies Keys<ext.SnipResult>;
const collapseParamKeys = { sessionId: true, from: true, to: true, summary: true } satisfies Keys<ext.CollapseParams>;
const collapseResultKeys = { collapseId: true, tokensFreed: true, usage: true } satisfies Keys<ext.CollapseResult>;
const usageChangedKeys = { sessionId: true, usage: true } satisfies Keys<ext.UsageChangedParams>;
const contextChangedKeys = { sessionId: true, paths: true } satisfies Keys<ext.ContextChangedParams>;
const capabilityKeys = { version: true, protocol: true, methods: true, notifications: true, stateDir: true, processId: true, degraded: true } satisfies Keys<ext.CtxdCapabilities>;
const initKeys = { stateDir: true, autoCompactWindow: true, settings: true } satisfies Keys<ext.InitializationOptions>;
const settingsKeys = {
    autoCompactWindow: true, autoCompactEnabled: true, idleCompaction: true, idleCompactAfterSeconds: true, modelSettings: true,
    hooks: true, provider: true, model: true, compactModel: true, largerModelRetry: true, compactFork: true, baseUrl: true, apiKeyEnv: true,
    memoryFileNames: true, observeClaudeProjects: true, claudeIdleCompaction: true, claudeIdleCompactAfterSeconds: true,
    claudeIdleCompactPercent: true, trustedFolders: true, importFolders: true, gateway: true,
} satisfies Keys<ext.Settings>;
const gatewaySettingsKeys = { enabled: true, listen: true, upstream: true, precompute: true, precomputeIdleSeconds: true, precomputeAtPercent: true } satisfies Keys<ext.GatewaySettings>;
const modelSettingsKeys = { autoCompactWindow: true } satisfies Keys<ext.ModelSettings>;

type OptionalKeys<T> = { [K in keyof T]-?: undefined extends T[K] ? K : never }[keyof T];
/** The optional keys of T: the argument must name each of them and nothing else. */
function optionalOf<T>(all: { [K in OptionalKeys<T>]: true }): string[] {
    return Object.keys(all);
}

/** Every value of a string union, checked both ways at compile time. */
function values<T extends string>(all: { [K in T]: true }): string[] {
    return Object.keys(all).sort();
}
const windowSources = values<ext.WindowSource>({ env: true, setting: true, client: true, experiment: true, modelDefault: true, subagentCeiling: true });
const providers = values<ext.ProviderKind>({ anthropic: true, openai: true, offline: true });
const memoryFileStatuses = values<ext.MemoryFileStatus>({ loaded: true, waiting: true, duplicate: true });
const compactOrigins = values<ext.CompactOrigin>({ requested: true, joined: true, queued: true });

/** Properties of the schema named `name`, or of its `$defs` entry `def`. */
function schemaKeys(name: string, def?: string): string[] {
    const s = schema(name);
    const target = def !== undefined ? s.$defs?.[def] : s;
    assert.ok(target, `${name} has ${def}`);
    return Object.keys(target.properties).sort();
}

function keys(o: object, extra: string[] = []): string[] {
    return Object.keys(o).filter((k) => !extra.includes(k)).sort();
}

describe("lsp_ext.ts against schemas/", () => {
    it("has every field of the usage object", () => {
        assert.deepEqual(keys(usageKeys), schemaKeys("ctx.usage.result", "Usage"));
        assert.deepEqual(keys(breakdownKeys), schemaKeys("ctx.usage.result", "Breakdown"));
        assert.deepEqual(keys(messageKeys), schemaKeys("ctx.usage.result", "MessageBreakdown"));
        assert.deepEqual(keys(promptCacheKeys), schemaKeys("ctx.usage.result", "PromptCache"));
    });

    it("has every field of the request and notification shapes", () => {
        const shapes: [string, object, string?][] = [
            ["ctx.openSession.params", openParamKeys],
            ["ctx.openSession.params", agentKeys, "AgentSettings"],
            ["ctx.skillInvoked.params", skillInvokedKeys],
            ["ctx.skillInvoked.result", usageResultKeys],
            ["ctx.setPlan.params", setPlanKeys],
            ["ctx.setPlan.result", usageResultKeys],
            ["ctx.openSession.result", openResultKeys],
            ["ctx.append.params", appendParamKeys],
            ["ctx.append.result", appendResultKeys],
            ["ctx.usage.params", sessionParamKeys],
            ["ctx.usage.result", usageResultKeys],
            ["ctx.closeSession.params", sessionParamKeys],
            ["ctx.context.params", sessionParamKeys],
            ["ctx.context.result", contextResultKeys],
            ["ctx.context.result", memoryFileKeys, "MemoryFile"],
            ["ctx.context.result", pendingRuleKeys, "PendingRule"],
            ["ctx.context.result", instantCompactionKeys, "InstantCompactionStats"],
            ["ctx.setAutoCompactWindow.params", windowParamKeys],
            ["ctx.setAutoCompactWindow.result", windowResultKeys],
            ["ctx.fileRead.params", fileReadParamKeys],
            ["ctx.fileRead.result", fileReadResultKeys],
            ["ctx.compact.params", compactParamKeys],
            ["ctx.compact.result", compactResultKeys],
            ["ctx.undoCompact.params", sessionParamKeys],
            ["ctx.undoCompact.result", undoCompactResultKeys],
            ["ctx.clear.params", sessionParamKeys],
            ["ctx.clear.result", clearResultKeys],
            ["ctx.reportProviderError.params", providerErrorParamKeys],
            ["ctx.reportProviderError.params", providerErrorKeys, "ProviderErrorReport"],
            ["ctx.reportProviderError.result", providerErrorResultKeys],
            ["ctx.reportProviderError.result", compactResultKeys, "CompactResult"],
            ["ctx.observe.params", observeParamKeys],
            ["ctx.observe.result", observeResultKeys],
            ["ctx.snip.params", snipParamKeys],
            ["ctx.snip.result", snipResultKeys],
            ["ctx.collapse.params", collapseParamKeys],
            ["ctx.collapse.result", collapseResultKeys],
            ["ctx.assemble.params", assembleParamKeys],
            ["ctx.assemble.params", forkKeys, "ForkParams"],
            ["ctx.assemble.result", assembleResultKeys],
            ["ctx.assemble.result", appliedStageKeys, "AppliedStage"],
            ["ctx.assemble.result", scrollbackKeys, "Scrollback"],
            ["ctx.assemble.result", scrollbackEntryKeys, "ScrollbackEntry"],
            ["ctx.assemble.result", resultMarkKeys, "ResultMark"],
            ["ctx.usageChanged.params", usageChangedKeys],
            ["ctx.compacted.params", compactedKeys],
            ["ctx.compactFailed.params", compactFailedKeys],
            ["ctx.contextChanged.params", contextChangedKeys],
            ["capabilities", capabilityKeys],
            ["initializationOptions", initKeys],
            ["settings", settingsKeys],
            ["settings", modelSettingsKeys, "ModelSettings"],
            ["settings", gatewaySettingsKeys, "GatewaySettings"],
        ];
        for (const [name, declared, def] of shapes) {
            assert.deepEqual(keys(declared), schemaKeys(name, def), `${name}${def !== undefined ? ` ${def}` : ""}`);
        }
    });

    it("keeps the optional fields optional and the required ones required", () => {
        // Exactly the fields the schema does not require are optional in lsp_ext.ts (`?`):
        // `optionalOf<T>` takes every optional key of T and no other, at compile time.
        const optional: [string, string[], string?][] = [
            ["ctx.openSession.params", optionalOf<ext.OpenSessionParams>({ sessionId: true, import: true, agent: true })],
            ["ctx.openSession.params", optionalOf<ext.AgentSettings>({ name: true, autoCompactWindow: true }), "AgentSettings"],
            ["ctx.openSession.result", optionalOf<ext.OpenSessionResult>({ diagnostics: true })],
            ["ctx.append.result", optionalOf<ext.AppendResult>({})],
            ["ctx.usage.result", optionalOf<ext.UsageResult>({})],
            ["ctx.usage.result", optionalOf<ext.Usage>({ cache: true }), "Usage"],
            ["ctx.usage.result", optionalOf<ext.PromptCache>({ recacheTokens: true, recacheCostUsd: true, pricesDate: true }), "PromptCache"],
            ["ctx.setAutoCompactWindow.result", optionalOf<ext.SetAutoCompactWindowResult>({ warnings: true, requested: true, adjustment: true, reason: true })],
            ["ctx.fileRead.params", optionalOf<ext.FileReadParams>({ startLine: true, numLines: true })],
            ["ctx.fileRead.result", optionalOf<ext.FileReadResult>({ totalLines: true })],
            ["ctx.context.result", optionalOf<ext.ContextResult>({ diagnostics: true, staleFiles: true, preparedAhead: true, instantCompaction: true })],
            ["ctx.context.result", optionalOf<ext.InstantCompactionStats>({}), "InstantCompactionStats"],
            ["ctx.context.result", optionalOf<ext.MemoryFile>({}), "MemoryFile"],
            ["ctx.compact.params", optionalOf<ext.CompactParams>({ instructions: true, from: true, upTo: true, workDoneToken: true })],
            ["ctx.compact.result", optionalOf<ext.CompactResult>({ problems: true, summaryPath: true, origin: true })],
            ["ctx.undoCompact.result", optionalOf<ext.UndoCompactResult>({})],
            ["ctx.clear.result", optionalOf<ext.ClearResult>({})],
            ["ctx.reportProviderError.params", optionalOf<ext.ProviderErrorReport>({ status: true, type: true }), "ProviderErrorReport"],
            ["ctx.reportProviderError.result", optionalOf<ext.ReportProviderErrorResult>({ compact: true })],
            ["ctx.snip.result", optionalOf<ext.SnipResult>({ unknown: true })],
            ["ctx.collapse.params", optionalOf<ext.CollapseParams>({ summary: true })],
            ["ctx.assemble.params", optionalOf<ext.AssembleParams>({ system: true, tools: true, thinking: true, fork: true, includeSnipped: true, since: true })],
            ["ctx.assemble.params", optionalOf<ext.ForkParams>({ skipCacheWrite: true }), "ForkParams"],
            ["ctx.assemble.result", optionalOf<ext.AssembleResult>({ scrollback: true })],
            ["ctx.assemble.result", optionalOf<ext.AppliedStage>({ detail: true }), "AppliedStage"],
            ["ctx.assemble.result", optionalOf<ext.Scrollback>({ boundaryUuid: true }), "Scrollback"],
            ["ctx.assemble.result", optionalOf<ext.ScrollbackEntry>({ uuid: true, parentUuid: true, attachmentType: true, timestampMs: true, hidden: true, results: true, span: true }), "ScrollbackEntry"],
            ["ctx.usageChanged.params", optionalOf<ext.UsageChangedParams>({})],
            ["ctx.contextChanged.params", optionalOf<ext.ContextChangedParams>({})],
            ["ctx.compacted.params", optionalOf<ext.CompactedParams>({})],
            ["ctx.compactFailed.params", optionalOf<ext.CompactFailedParams>({})],
            ["capabilities", optionalOf<ext.CtxdCapabilities>({ degraded: true })],
        ];
        for (const [name, fields, def] of optional) {
            const s = schema(name);
            const target = def !== undefined ? s.$defs?.[def] : s;
            assert.ok(target, `${name} ${def ?? ""}`);
            const notRequired = Object.keys(target.properties).filter((k) => !(target.required ?? []).includes(k));
            assert.deepEqual([...fields].sort(), notRequired.sort(), `${name} ${def ?? ""}`);
        }
    });

    it("has every value of the string unions the schemas list", () => {
        const enumOf = (name: string, def: string) => [...((schema(name).$defs?.[def] as unknown as { enum?: string[] } | undefined)?.enum ?? [])].sort();
        assert.deepEqual(providers, enumOf("settings", "ProviderKind"));
        const sources = (schema("ctx.usage.result").$defs?.["PromptCacheSource"] as unknown as { oneOf: { const: string }[] }).oneOf.map((o) => o.const);
        assert.deepEqual(values<ext.PromptCacheSource>({ program: true, gateway: true }), sources.sort());
        assert.deepEqual(enumOf("ctx.setAutoCompactWindow.params", "AutoWord"), ["auto"]);
        // Closed sets are enums in the schemas, one `const` per value.
        const constsOf = (name: string, def: string) =>
            [...((schema(name).$defs?.[def] as unknown as { oneOf?: { const: string }[] } | undefined)?.oneOf ?? [])]
                .map((v) => v.const)
                .sort();
        assert.deepEqual(windowSources, constsOf("ctx.setAutoCompactWindow.result", "WindowSource"));
        assert.deepEqual(memoryFileStatuses, constsOf("ctx.context.result", "MemoryStatus"));
        assert.deepEqual(compactOrigins, constsOf("ctx.compact.result", "CompactOrigin"));
    });

    it("keeps the shared render fixtures valid usage objects", () => {
        const required = schema("ctx.usage.result").$defs?.Usage.required ?? [];
        for (const c of renderCases.usageCases) {
            assert.deepEqual(Object.keys(c.usage).sort(), [...required].sort(), c.name);
        }
    });

    it("keeps the shared context and window fixtures valid answers", () => {
        const { context } = renderCases.contextCase;
        const contextSchema = schema("ctx.context.result");
        assert.deepEqual(keys(context), schemaKeys("ctx.context.result"), "contextCase.context has every field");
        for (const field of contextSchema.required ?? []) {
            assert.ok(field in context, `contextCase.context.${field}`);
        }
        for (const file of context.memoryFiles) {
            assert.deepEqual(keys(file), schemaKeys("ctx.context.result", "MemoryFile"));
            assert.ok(memoryFileStatuses.includes(file.status), file.status);
        }
        const windowRequired = schema("ctx.setAutoCompactWindow.result").required ?? [];
        for (const { result } of [...renderCases.windowCases, ...renderCases.windowReasonCases]) {
            for (const field of windowRequired) {
                assert.ok(field in result, `windowCases result.${field}`);
            }
            assert.ok(Object.keys(result).every((k) => k in windowResultKeys), JSON.stringify(result));
            assert.ok(windowSources.includes(result.source), result.source);
        }
    });
});

describe("protocol.ts", () => {
    it("is generated from schemas/ and current (node scripts/gen-protocol.js)", () => {
        // eslint-disable-next-line @typescript-eslint/no-require-imports
        const generator = require(path.join(packageRoot, "scripts", "gen-protocol.js")) as { generate(): string; outFile: string };
        assert.equal(fs.readFileSync(generator.outFile, "utf8"), generator.generate());
    });

    it("has a type for every schema file and every method", () => {
        const text = fs.readFileSync(path.join(packageRoot, "src", "protocol.ts"), "utf8");
        let methods = 0;
        for (const file of fs.readdirSync(path.join(packageRoot, "../../schemas"))) {
            const title = JSON.parse(fs.readFileSync(path.join(packageRoot, "../../schemas", file), "utf8")).title as string;
            assert.match(text, new RegExp(`export (interface|type) ${title}\\b`), file);
            const method = /^ctx\.(\w+)\.params\.json$/.exec(file);
            if (method) {
                methods += 1;
                assert.ok(text.includes(`"ctx/${method[1]}": `), method[1]);
            }
        }
        assert.ok(methods > 0, "no ctx.<method>.params.json among the schemas: the methods went unchecked");
    });
});

describe("lsp_ext.ts against the proto crate", () => {
    it("has ctxd's error codes", () => {
        const source = fs.readFileSync(path.join(packageRoot, "../../daemon/proto/src/lib.rs"), "utf8");
        const block = /pub mod error_codes \{([\s\S]*?)\n\}/.exec(source)?.[1];
        assert.ok(block, "error_codes in daemon/proto/src/lib.rs");
        const pascal = (name: string) => name.toLowerCase().replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase());
        const daemonCodes = Object.fromEntries(
            [...block.matchAll(/pub const ([A-Z_]+): i64 = (-\d+);/g)].map(([, name, code]) => [pascal(name), Number(code)]),
        );
        const ours = Object.fromEntries(Object.entries(ext.ErrorCodes).filter(([, code]) => code <= -33000));
        assert.deepEqual(ours, daemonCodes);
    });
});

describe("lsp_ext.ts against the running daemon", () => {
    let daemon: TestDaemon;
    before(async () => {
        daemon = await startDaemon(tempStateDir());
    });
    after(async () => {
        await daemon.stop();
    });

    it("declares every method and notification the daemon announces", () => {
        const requests = [
            ext.openSession, ext.append, ext.usage, ext.closeSession, ext.setAutoCompactWindow, ext.fileRead, ext.context, ext.compact,
            ext.clear, ext.reportProviderError, ext.assemble, ext.snip, ext.collapse, ext.observe,
            ext.skillInvoked, ext.setPlan, ext.undoCompact, ext.claudeCompact, ext.claudeUndo,
            ext.searchHistory, ext.readHistory,
        ].map((t) => t.method);
        const notifications = [ext.usageChanged, ext.contextChanged, ext.compacted, ext.compactFailed].map((t) => t.method);
        for (const m of daemon.capabilities.methods) {
            assert.ok(requests.includes(m), `lsp_ext.ts declares ${m}`);
        }
        for (const m of requests) {
            assert.ok(daemon.capabilities.methods.includes(m), `the daemon announces ${m}`);
        }
        for (const n of daemon.capabilities.notifications) {
            assert.ok(notifications.includes(n), `lsp_ext.ts declares ${n}`);
        }
        for (const n of notifications) {
            assert.ok(daemon.capabilities.notifications.includes(n), `the daemon announces ${n}`);
        }
        assert.equal(daemon.capabilities.protocol, 1);
    });

    it("announces what CtxdCapabilities says, processId included", () => {
        assert.deepEqual(keys(daemon.capabilities), keys(capabilityKeys, ["degraded"]));
        assert.equal(daemon.capabilities.processId, daemon.process.pid, "the pid of the process the test started");
        assert.equal(daemon.capabilities.stateDir, daemon.stateDir);
    });

    it("answers -32601 for a method it does not have", async () => {
        await assert.rejects(daemon.rpc.sendRequest("ctx/noSuchMethod", { sessionId: "s" }), (e: unknown) => {
            assert.equal((e as { code?: number }).code, ext.ErrorCodes.MethodNotFound);
            return true;
        });
    });
});
