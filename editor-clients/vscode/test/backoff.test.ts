import * as assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Backoff } from "../src/backoff";

describe("Backoff", () => {
    it("doubles up to the ceiling while the daemon keeps dying", () => {
        const backoff = new Backoff({ initialMs: 500, maxMs: 4000, stableMs: 60_000 });
        backoff.started(0);
        const delays = [1, 2, 3, 4, 5].map((t) => backoff.nextDelay(t));
        assert.deepEqual(delays, [500, 1000, 2000, 4000, 4000]);
    });

    it("starts again from the first delay after a stable run", () => {
        const backoff = new Backoff({ initialMs: 500, maxMs: 4000, stableMs: 60_000 });
        backoff.started(0);
        backoff.nextDelay(10);
        backoff.nextDelay(20);
        backoff.started(1_000);
        assert.equal(backoff.nextDelay(61_000), 500);
    });
});
