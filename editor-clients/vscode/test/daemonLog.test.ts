import * as assert from "node:assert/strict";
import { describe, it } from "node:test";

import { parseLogLine } from "../src/daemonLog";

describe("parseLogLine", () => {
    it("reads the level of a tracing line and drops its timestamp", () => {
        assert.deepEqual(
            parseLogLine('2026-11-29T21:57:40.060152Z  INFO ctxd: ctxd starting version="0.1.0"'),
            {
                level: "info",
                text: 'ctxd: ctxd starting version="0.1.0"',
            },
        );
        assert.deepEqual(
            parseLogLine(
                "2026-11-29T21:57:40.498794Z  WARN tower_lsp_server::server: not implemented",
            ),
            {
                level: "warn",
                text: "tower_lsp_server::server: not implemented",
            },
        );
    });

    it("shows anything else as an error", () => {
        assert.deepEqual(parseLogLine("thread 'main' panicked at src/main.rs:1:1"), {
            level: "error",
            text: "thread 'main' panicked at src/main.rs:1:1",
        });
    });
});
