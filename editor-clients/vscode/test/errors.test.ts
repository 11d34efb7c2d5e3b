/**
 * Every failure a user reads is one plain sentence: the cases both editor clients share
 * (`editor-clients/fixtures/error-cases.json`), worded with no method names or codes.
 */
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";

import { describeError } from "../src/errors";
import { packageRoot } from "./support/daemon";

interface ErrorCase {
    method: string;
    error: { code?: number; message: string; data?: unknown };
    text: string;
}

const cases: ErrorCase[] = JSON.parse(
    fs.readFileSync(path.join(packageRoot, "../fixtures/error-cases.json"), "utf8"),
).cases;

describe("describeError", () => {
    it("words every shared case as the fixture says", () => {
        for (const c of cases) {
            assert.equal(describeError(c.method, c.error), c.text, JSON.stringify(c.error));
        }
    });

    it("names no method and no error code in any of them", () => {
        assert.ok(cases.length >= 20);
        for (const c of cases) {
            const text = describeError(c.method, c.error);
            assert.doesNotMatch(text, /ctx\/|error -?\d{4,}|\(-?\d{5}\)/, text);
        }
    });

    it("takes an Error as well as a JSON-RPC error object", () => {
        assert.equal(
            describeError(
                "ctx/compact",
                new Error("ctxd is not running; ctx/compact was not sent"),
            ),
            "ctxd could not compact the session: ctxd is not running right now. It restarts on its own; try again in a moment.",
        );
    });
});
