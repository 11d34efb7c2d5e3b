/**
 * `src/lsp_ext.ts` mirrors the daemon's wire types by hand. These lists are checked
 * against the types at compile time (`satisfies`) and against `schemas/` at run time,
 * so a field added or renamed in the Rust types fails here until lsp_ext.ts follows.
 */
import * as assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import * as ext from "../src/lsp_ext";
import { renderCases, schema } from "./support/fixtures";
import { startDaemon, tempStateDir, type TestDaemon } from "./support/daemon";

type Keys<T> = { [K in keyof Required<T>]: true };

const usageKeys = {
    tokens: true, reportedTokens: true, estimatedTokens: true, window: true, effectiveWindow: true,
    threshold: true, warning: true, blocked: true, percentUsed: true, percentUntilCompact: true,
    tokensUntilCompact: true, level: true, autoCompactEnabled: true, breakdown: true,
} satisfies Keys<ext.Usage>;
const breakdownKeys = {
    systemPrompt: true, tools: true, memoryFiles: true, skills: true, messages: true, freeSpace: true, autocompactBuffer: true,
} satisfies Keys<ext.Breakdown>;
const messageKeys = { toolResults: true, summaries: true, other: true } satisfies Keys<ext.MessageBreakdown>;
const openResultKeys = { sessionId: true, resumed: true, records: true, diagnostics: true, usage: true } satisfies Keys<ext.OpenSessionResult>;
const appendResultKeys = { appended: true, duplicates: true, records: true, usage: true } satisfies Keys<ext.AppendResult>;
const capabilityKeys = { version: true, protocol: true, methods: true, notifications: true, stateDir: true, processId: true } satisfies Keys<ext.CtxdCapabilities>;
const initKeys = { stateDir: true, autoCompactWindow: true, settings: true } satisfies Keys<ext.InitializationOptions>;

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
    });

    it("has every field of the request and notification shapes", () => {
        assert.deepEqual(keys(openResultKeys), schemaKeys("ctx.openSession.result"));
        assert.deepEqual(keys(appendResultKeys), schemaKeys("ctx.append.result"));
        assert.deepEqual(keys(capabilityKeys), schemaKeys("capabilities"));
        assert.deepEqual(keys(initKeys), schemaKeys("initializationOptions"));
        // `import` is named by PROTOCOL.md but not answered by the daemon yet.
        assert.deepEqual(keys({ cwd: true, model: true, sessionId: true, import: true } satisfies Keys<ext.OpenSessionParams>, ["import"]), schemaKeys("ctx.openSession.params"));
        assert.deepEqual(["sessionId", "usage"], schemaKeys("ctx.usageChanged.params"));
    });

    it("keeps the shared render fixtures valid usage objects", () => {
        const required = schema("ctx.usage.result").$defs?.Usage.required ?? [];
        for (const c of renderCases.usageCases) {
            assert.deepEqual(Object.keys(c.usage).sort(), [...required].sort(), c.name);
        }
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
        const requests = [ext.openSession, ext.append, ext.usage, ext.closeSession, ext.compact, ext.context,
            ext.setAutoCompactWindow, ext.clear, ext.assemble].map((t) => t.method);
        const notifications = [ext.usageChanged, ext.compacted, ext.compactFailed, ext.contextChanged].map((t) => t.method);
        for (const m of daemon.capabilities.methods) {
            assert.ok(requests.includes(m), `lsp_ext.ts declares ${m}`);
        }
        for (const n of daemon.capabilities.notifications) {
            assert.ok(notifications.includes(n), `lsp_ext.ts declares ${n}`);
        }
        assert.equal(daemon.capabilities.protocol, 1);
    });
});
