/**
 * Where Claude Code keeps a folder's transcripts, the id ctxd publishes a transcript
 * under, and the model read from a transcript's tail.
 */
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";

import { claudeConfigDir, claudeProjectDir, isObservedId, observeId, transcriptModel } from "../src/claude";

describe("Claude Code's project folders", () => {
    it("is $CLAUDE_CONFIG_DIR, else ~/.claude", () => {
        assert.equal(claudeConfigDir({ CLAUDE_CONFIG_DIR: "/etc/claude" }, "/home/u"), "/etc/claude");
        assert.equal(claudeConfigDir({ CLAUDE_CONFIG_DIR: "" }, "/home/u"), "/home/u/.claude");
        assert.equal(claudeConfigDir({}, "/home/u"), "/home/u/.claude");
    });

    it("names a folder's project with every character but ASCII letters and digits as -", () => {
        assert.equal(claudeProjectDir("/home/u/my.app_1", "/c"), "/c/projects/-home-u-my-app-1");
        assert.equal(claudeProjectDir("/srv/a b/Ünï", "/c"), "/c/projects/-srv-a-b--n-");
    });
});

describe("observeId", () => {
    it("is FNV-1a (64-bit) of the path, as the daemon computes it", () => {
        assert.equal(observeId(""), "observe-cbf29ce484222325");
        assert.equal(observeId("a"), "observe-af63dc4c8601ec8c");
        assert.ok(isObservedId(observeId("/x.jsonl")));
        assert.ok(!isObservedId("3f1c…"));
    });
});

describe("transcriptModel", () => {
    it("reads the latest real model from the tail, skipping synthetic ones and cut lines", () => {
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-claude-"));
        const file = path.join(dir, "t.jsonl");
        const assistant = (model: string) => JSON.stringify({ type: "assistant", message: { role: "assistant", model, content: [] } });
        fs.writeFileSync(file, [assistant("claude-opus-4-1"), assistant("claude-sonnet-4-5-20250929"), assistant("<synthetic>"), '{"type":"assistant","mess'].join("\n"));
        assert.equal(transcriptModel(file), "claude-sonnet-4-5-20250929");
        assert.equal(transcriptModel(path.join(dir, "missing.jsonl")), undefined);
    });
});
