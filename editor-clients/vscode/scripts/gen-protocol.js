#!/usr/bin/env node
// Generates src/protocol.ts, the protocol's TypeScript types and a vscode-jsonrpc
// `RequestType`/`NotificationType` per method, from the JSON Schemas in schemas/ (which
// the proto crate generates from the Rust types):
//
//   node scripts/gen-protocol.js          # writes src/protocol.ts
//   node scripts/gen-protocol.js --check  # exits 1 when src/protocol.ts is stale
//
// Each schema file gives one type named by its title; its `$defs` give the types it
// refers to, written once (a name defined differently by two files is an error).
// `requests.json` and `notifications.json` list the methods (documented); a method's
// params and result types are those of `ctx.<method>.params.json` and
// `.result.json` (no result file: the result is null). Only
// the JSON Schema the proto crate emits is handled: objects with properties and
// `required`, `$ref`, `anyOf`/`oneOf`, `enum`, `const`, arrays, type lists with `null`,
// and `additionalProperties`.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const root = path.resolve(__dirname, "..");
const schemasDir = path.resolve(root, "../../schemas");
const outFile = path.join(root, "src", "protocol.ts");

function comment(description, indent) {
    if (!description) {
        return "";
    }
    const lines = description.split("\n");
    if (lines.length === 1) {
        return `${indent}/** ${lines[0].replace(/\*\//g, "*\\/")} */\n`;
    }
    return `${indent}/**\n${lines.map((l) => `${indent} * ${l.replace(/\*\//g, "*\\/")}`.trimEnd()).join("\n")}\n${indent} */\n`;
}

function refName(ref) {
    const match = /^#\/(?:\$defs|definitions)\/(.+)$/.exec(ref);
    if (!match) {
        throw new Error(`unsupported $ref ${ref}`);
    }
    return match[1];
}

function scalar(type) {
    switch (type) {
        case "integer":
        case "number":
            return "number";
        case "string":
            return "string";
        case "boolean":
            return "boolean";
        case "null":
            return "null";
        case "array":
            return "unknown[]";
        case "object":
            return "Record<string, unknown>";
        default:
            throw new Error(`unsupported type ${type}`);
    }
}

/** The TypeScript type of a schema, written at `indent` (for nested objects). */
function typeOf(schema, indent) {
    if (
        schema === true ||
        schema === undefined ||
        (typeof schema === "object" && Object.keys(schema).length === 0)
    ) {
        return "unknown";
    }
    if (schema.$ref) {
        return refName(schema.$ref);
    }
    if (schema.const !== undefined) {
        return JSON.stringify(schema.const);
    }
    if (schema.enum) {
        return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
    }
    const union = schema.anyOf ?? schema.oneOf;
    if (union) {
        return union.map((s) => typeOf(s, indent)).join(" | ");
    }
    const types = Array.isArray(schema.type) ? schema.type : schema.type ? [schema.type] : [];
    if (types.length === 0 && schema.properties) {
        types.push("object");
    }
    if (types.length === 0) {
        return "unknown"; // any JSON value (e.g. an LSP progress token)
    }
    return types
        .map((t) => {
            if (t === "array") {
                const item = typeOf(schema.items, indent);
                return /[ |]/.test(item) ? `(${item})[]` : `${item}[]`;
            }
            if (
                t === "object" &&
                (schema.properties || schema.additionalProperties !== undefined)
            ) {
                return objectType(schema, indent);
            }
            return scalar(t);
        })
        .join(" | ");
}

function objectType(schema, indent) {
    if (
        !schema.properties &&
        schema.additionalProperties !== undefined &&
        schema.additionalProperties !== false
    ) {
        const value =
            schema.additionalProperties === true
                ? "unknown"
                : typeOf(schema.additionalProperties, indent);
        return `Record<string, ${value}>`;
    }
    const required = new Set(schema.required ?? []);
    const inner = `${indent}    `;
    const fields = Object.entries(schema.properties ?? {}).map(([name, property]) => {
        const key = /^[A-Za-z_$][\w$]*$/.test(name) ? name : JSON.stringify(name);
        const optional = required.has(name) ? "" : "?";
        return `${comment(property.description, inner)}${inner}${key}${optional}: ${typeOf(property, inner)};`;
    });
    if (schema.additionalProperties && schema.additionalProperties !== false) {
        fields.push(
            `${inner}[key: string]: ${typeOf(schema.additionalProperties === true ? {} : schema.additionalProperties, inner)};`,
        );
    }
    return fields.length === 0 ? "Record<string, never>" : `{\n${fields.join("\n")}\n${indent}}`;
}

function declaration(name, schema) {
    const body = typeOf(schema, "");
    const doc = comment(schema.description, "");
    if (body.startsWith("{\n") && !schema.anyOf && !schema.oneOf) {
        return `${doc}export interface ${name} ${body}\n`;
    }
    return `${doc}export type ${name} = ${body};\n`;
}

/** The whole of src/protocol.ts for the schemas in `dir`. */
function generate(dir = schemasDir) {
    const files = fs
        .readdirSync(dir)
        .filter((f) => f.endsWith(".json"))
        .sort();
    const declared = new Map();
    const add = (name, schema, from) => {
        const text = declaration(name, schema);
        const known = declared.get(name);
        if (known !== undefined && known.text !== text) {
            throw new Error(`${name} is defined differently in ${known.from} and ${from}`);
        }
        declared.set(name, { text, from });
    };
    const parts = new Map();
    for (const file of files) {
        const schema = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
        const { $defs = {}, definitions = {}, ...top } = schema;
        for (const [name, def] of Object.entries({ ...definitions, ...$defs })) {
            add(name, def, file);
        }
        const name =
            schema.title ??
            file.replace(/\.json$/, "").replace(/(^|[.])(\w)/g, (_, __, c) => c.toUpperCase());
        add(name, top, file);
        const method = /^ctx\.(\w+)\.(params|result)\.json$/.exec(file);
        if (method) {
            parts.set(`ctx/${method[1]}`, { ...parts.get(`ctx/${method[1]}`), [method[2]]: name });
        }
    }
    // The methods in the order the proto crate lists them, with their documentation.
    const listed = (file) =>
        JSON.parse(fs.readFileSync(path.join(dir, file), "utf8")).oneOf.map((m) => ({
            ...m,
            ...parts.get(m.const),
        }));
    const requests = listed("requests.json");
    const notifications = listed("notifications.json");
    for (const m of [...requests, ...notifications]) {
        if (m.params === undefined) {
            throw new Error(`${m.const} has no ctx.<method>.params.json`);
        }
    }
    const sorted = (list) => [...list].sort((a, b) => a.const.localeCompare(b.const));
    const constant = (m) => m.const.replace(/^ctx\//, "");
    return [
        "// Generated by scripts/gen-protocol.js from schemas/ (the proto crate's JSON Schemas).",
        "// Do not edit: run `node scripts/gen-protocol.js` after `UPDATE_SCHEMAS=1 cargo test -p ctxd-proto`.",
        "/* eslint-disable */",
        'import { NotificationType, RequestType } from "vscode-jsonrpc";',
        "",
        ...[...declared.keys()].sort().map((name) => declared.get(name).text),
        "/** Each `ctx/` request with the types of its params and result (`null`: the result is null). */",
        "export interface CtxRequests {",
        ...sorted(requests).map(
            (m) =>
                `    ${JSON.stringify(m.const)}: { params: ${m.params}; result: ${m.result ?? "null"} };`,
        ),
        "}",
        "",
        "/** Each notification ctxd sends, with the type of its params. */",
        "export interface CtxNotifications {",
        ...sorted(notifications).map((m) => `    ${JSON.stringify(m.const)}: ${m.params};`),
        "}",
        "",
        ...requests.map(
            (m) =>
                `${comment(m.description, "")}export const ${constant(m)} = new RequestType<${m.params}, ${m.result ?? "null"}, void>(${JSON.stringify(m.const)});\n`,
        ),
        ...notifications.map(
            (m) =>
                `${comment(m.description, "")}export const ${constant(m)} = new NotificationType<${m.params}>(${JSON.stringify(m.const)});\n`,
        ),
    ].join("\n");
}

module.exports = { generate, outFile };

if (require.main === module) {
    const text = generate();
    if (process.argv.includes("--check")) {
        const current = fs.existsSync(outFile) ? fs.readFileSync(outFile, "utf8") : "";
        if (current !== text) {
            console.error("src/protocol.ts is stale: run node scripts/gen-protocol.js");
            process.exit(1);
        }
    } else {
        fs.writeFileSync(outFile, text);
        console.log(`wrote ${path.relative(process.cwd(), outFile)}`);
    }
}
