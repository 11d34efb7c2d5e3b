/**
 * The README's settings table names every setting the extension contributes, and no
 * other: a setting added to package.json without a line in the README fails here.
 */
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";

import { packageRoot } from "./support/daemon";

/** The settings named in the first column of the README's `## Settings` table. */
function readmeSettings(): string[] {
    const readme = fs.readFileSync(path.join(packageRoot, "README.md"), "utf8");
    const section = readme.split(/^## /m).find((s) => s.startsWith("Settings\n"));
    assert.ok(section, "the README has a Settings section");
    const rows = section.split("\n").filter((l) => l.startsWith("| `ctxd."));
    return rows.flatMap((row) => [...row.split("|")[1].matchAll(/`(ctxd\.[A-Za-z.]+)`/g)].map((m) => m[1]));
}

describe("README", () => {
    it("lists every setting of package.json's contributes.configuration, and only those", () => {
        const manifest = JSON.parse(fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"));
        const contributed = Object.keys(manifest.contributes.configuration.properties).sort();
        assert.ok(contributed.includes("ctxd.claudeIdleCompaction"));
        assert.deepEqual([...readmeSettings()].sort(), contributed);
    });
});
