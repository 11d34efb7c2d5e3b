/**
 * How long to wait before restarting a daemon that died: doubling from `initialMs` up
 * to `maxMs`, back to `initialMs` once a run lasted `stableMs`. Pure apart from the
 * clock, which the caller passes in.
 */
export interface BackoffOptions {
    initialMs: number;
    maxMs: number;
    stableMs: number;
}

export const defaultBackoff: BackoffOptions = { initialMs: 500, maxMs: 30_000, stableMs: 60_000 };

export class Backoff {
    private failures = 0;
    private startedAt: number | undefined;

    constructor(private readonly options: BackoffOptions = defaultBackoff) {}

    /** Starts over from `initialMs` (the user asked for a restart). */
    reset(): void {
        this.failures = 0;
    }

    /** The daemon started (or restarted) at `now`. */
    started(now: number): void {
        this.startedAt = now;
    }

    /** The daemon died at `now`; returns the delay before the next start. */
    nextDelay(now: number): number {
        if (this.startedAt !== undefined && now - this.startedAt >= this.options.stableMs) {
            this.failures = 0;
        }
        const delay = Math.min(this.options.maxMs, this.options.initialMs * 2 ** this.failures);
        this.failures += 1;
        return delay;
    }
}
