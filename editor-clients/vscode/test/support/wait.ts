/**
 * Waiting for something asynchronous in tests, with a deadline. `explain` adds what
 * helps find the cause to the timeout's message (the client's log, say).
 */
export async function waitFor<T>(what: string, probe: () => T | undefined, timeoutMs = 10_000, explain?: () => string): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
        const value = probe();
        if (value !== undefined) {
            return value;
        }
        if (Date.now() > deadline) {
            throw new Error(`timed out waiting for ${what}${explain !== undefined ? `\n${explain()}` : ""}`);
        }
        await new Promise((resolve) => setTimeout(resolve, 10));
    }
}
