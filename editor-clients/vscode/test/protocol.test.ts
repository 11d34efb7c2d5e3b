/**
 * `src/protocol.ts` is generated from `schemas/` (types and method constants) and
 * `src/lsp_ext.ts` adds only what the schemas do not describe. These tests check that
 * the generated file is current, that it has a constant for every method the schemas
 * list, that the error codes match the proto crate's, and that the running daemon
 * announces exactly the methods the constants name.
 */
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import { NotificationType, RequestType } from "vscode-jsonrpc";

import * as ext from "../src/lsp_ext";
import { renderCases, schema } from "./support/fixtures";
import { packageRoot, startDaemon, tempStateDir, type TestDaemon } from "./support/daemon";

/** Properties of the schema named `name`, or of its `$defs` entry `def`. */
function schemaKeys(name: string, def?: string): string[] {
    const s = schema(name);
    const target = def !== undefined ? s.$defs?.[def] : s;
    assert.ok(target, `${name} has ${def}`);
    return Object.keys(target.properties).sort();
}

/** The values a closed set of `schemas/<name>.json` lists (one `const` each). */
function constsOf(name: string, def?: string): string[] {
    const s = schema(name) as unknown as {
        oneOf?: { const: string }[];
        $defs?: Record<string, { oneOf?: { const: string }[] }>;
    };
    const target = def !== undefined ? s.$defs?.[def] : s;
    return (target?.oneOf ?? []).map((v) => v.const).sort();
}

/** The method of each generated constant of one kind. */
function constants(kind: typeof RequestType | typeof NotificationType): string[] {
    return Object.values(ext)
        .filter((v) => v instanceof kind)
        .map((v) => (v as { method: string }).method)
        .sort();
}

describe("the shared fixtures against schemas/", () => {
    it("keeps the render fixtures valid usage objects", () => {
        const required = schema("ctx.usage.result").$defs?.Usage.required ?? [];
        for (const c of renderCases.usageCases) {
            assert.deepEqual(Object.keys(c.usage).sort(), [...required].sort(), c.name);
        }
    });

    it("keeps the context and window fixtures valid answers", () => {
        const { context } = renderCases.contextCase;
        assert.deepEqual(
            Object.keys(context).sort(),
            schemaKeys("ctx.context.result"),
            "contextCase.context has every field",
        );
        const statuses = constsOf("ctx.context.result", "MemoryStatus");
        for (const file of context.memoryFiles) {
            assert.deepEqual(
                Object.keys(file).sort(),
                schemaKeys("ctx.context.result", "MemoryFile"),
            );
            assert.ok(statuses.includes(file.status), file.status);
        }
        const windowRequired = schema("ctx.setAutoCompactWindow.result").required ?? [];
        const windowKeys = schemaKeys("ctx.setAutoCompactWindow.result");
        const sources = constsOf("ctx.setAutoCompactWindow.result", "WindowSource");
        for (const { result } of [...renderCases.windowCases, ...renderCases.windowReasonCases]) {
            for (const field of windowRequired) {
                assert.ok(field in result, `windowCases result.${field}`);
            }
            assert.ok(
                Object.keys(result).every((k) => windowKeys.includes(k)),
                JSON.stringify(result),
            );
            assert.ok(sources.includes(result.source), result.source);
        }
    });
});

describe("protocol.ts", () => {
    it("is generated from schemas/ and current (node scripts/gen-protocol.js)", () => {
        // eslint-disable-next-line @typescript-eslint/no-require-imports
        const generator = require(path.join(packageRoot, "scripts", "gen-protocol.js")) as {
            generate(): string;
            outFile: string;
        };
        assert.equal(fs.readFileSync(generator.outFile, "utf8"), generator.generate());
    });

    it("has a type for every schema file and every method", () => {
        const text = fs.readFileSync(path.join(packageRoot, "src", "protocol.ts"), "utf8");
        let methods = 0;
        for (const file of fs.readdirSync(path.join(packageRoot, "../../schemas"))) {
            const title = JSON.parse(
                fs.readFileSync(path.join(packageRoot, "../../schemas", file), "utf8"),
            ).title as string;
            assert.match(text, new RegExp(`export (interface|type) ${title}\\b`), file);
            const method = /^ctx\.(\w+)\.params\.json$/.exec(file);
            if (method) {
                methods += 1;
                assert.ok(text.includes(`"ctx/${method[1]}": `), method[1]);
            }
        }
        assert.ok(
            methods > 0,
            "no ctx.<method>.params.json among the schemas: the methods went unchecked",
        );
    });

    it("has a RequestType or NotificationType for every method the schemas list", () => {
        const requests = constsOf("requests");
        const notifications = constsOf("notifications");
        assert.ok(
            requests.length > 0 && notifications.length > 0,
            "requests.json and notifications.json list methods",
        );
        assert.deepEqual(constants(RequestType), requests);
        assert.deepEqual(constants(NotificationType), notifications);
        for (const method of [...requests, ...notifications]) {
            const name = method.replace(/^ctx\//, "") as keyof typeof ext;
            assert.equal(
                (ext[name] as { method?: string } | undefined)?.method,
                method,
                `ext.${name}`,
            );
        }
    });

    it("lists the reasons of a ctx/undoCompact refusal as the daemon writes them", () => {
        const reasons: ext.CannotUndoReason[] = ["nothingToUndo", "newTurnSince"];
        assert.deepEqual(
            constsOf("ctx.undoCompact.error", "CannotUndoReason"),
            [...reasons].sort(),
        );
    });
});

describe("lsp_ext.ts against the proto crate", () => {
    it("has ctxd's error codes", () => {
        const source = fs.readFileSync(
            path.join(packageRoot, "../../daemon/proto/src/lib.rs"),
            "utf8",
        );
        const block = /pub mod error_codes \{([\s\S]*?)\n\}/.exec(source)?.[1];
        assert.ok(block, "error_codes in daemon/proto/src/lib.rs");
        const pascal = (name: string) =>
            name.toLowerCase().replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase());
        const daemonCodes = Object.fromEntries(
            [...block.matchAll(/pub const ([A-Z_]+): i64 = (-\d+);/g)].map(([, name, code]) => [
                pascal(name),
                Number(code),
            ]),
        );
        const ours = Object.fromEntries(
            Object.entries(ext.ErrorCodes).filter(([, code]) => code <= -33000),
        );
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

    it("announces exactly the methods and notifications the generated constants name", () => {
        assert.deepEqual([...daemon.capabilities.methods].sort(), constants(RequestType));
        assert.deepEqual(
            [...daemon.capabilities.notifications].sort(),
            constants(NotificationType),
        );
        assert.equal(daemon.capabilities.protocol, 1);
    });

    it("announces what CtxdCapabilities says, processId included", () => {
        const announced = Object.keys(daemon.capabilities).sort();
        assert.deepEqual(
            announced,
            schemaKeys("capabilities").filter((k) => k !== "degraded"),
        );
        assert.equal(
            daemon.capabilities.processId,
            daemon.process.pid,
            "the pid of the process the test started",
        );
        assert.equal(daemon.capabilities.stateDir, daemon.stateDir);
    });

    it("answers -32601 for a method it does not have", async () => {
        await assert.rejects(
            daemon.rpc.sendRequest("ctx/noSuchMethod", { sessionId: "s" }),
            (e: unknown) => {
                assert.equal((e as { code?: number }).code, ext.ErrorCodes.MethodNotFound);
                return true;
            },
        );
    });
});
