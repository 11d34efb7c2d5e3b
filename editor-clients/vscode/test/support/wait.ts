/**
 * Waiting for something asynchronous in tests, with a deadline. `explain` adds what
 * helps find the cause to the timeout's message (the client's log, say).
 */
export async function waitFor<T>(
    what: string,
    probe: () => T | undefined,
    timeoutMs = 10_000,
    explain?: () => string,
): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
        const value = probe();
        if (value !== undefined) {
            return value;
        }
        if (Date.now() > deadline) {
            throw new Error(
                `timed out waiting for ${what}${explain !== undefined ? `\n${explain()}` : ""}`,
            );
        }
        await new Promise((resolve) => setTimeout(resolve, 10));
    }
}

/**
 * Resolves once every promise continuation queued before the call has run, and those they
 * queued in turn: a macrotask (`setImmediate`) runs only when the microtask queue is empty.
 * What a resolved promise sets off without timers or I/O is done by then.
 */
export function settled(): Promise<void> {
    return new Promise((resolve) => setImmediate(resolve));
}
