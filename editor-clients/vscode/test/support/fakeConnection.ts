/**
 * A `Connection` with scripted answers, for states the daemon does not produce yet
 * (compacting, a full `ctx/context` answer, a successful `ctx/compact`).
 */
import type { Disposable } from "vscode-jsonrpc";

import type { Connection } from "../../src/sessions";

type Answer = (params: unknown) => unknown;

export class FakeConnection implements Connection {
    readonly sent: { method: string; params: unknown }[] = [];
    private readonly answers = new Map<string, Answer>();
    private readonly handlers = new Map<string, (params: unknown) => void>();

    answer(method: string, answer: Answer): this {
        this.answers.set(method, answer);
        return this;
    }

    async request<R>(method: string, params: unknown): Promise<R> {
        this.sent.push({ method, params });
        const answer = this.answers.get(method);
        if (answer === undefined) {
            throw Object.assign(new Error(`unknown method: ${method}`), { code: -32601 });
        }
        return answer(params) as R;
    }

    onNotification(method: string, handler: (params: unknown) => void): Disposable {
        this.handlers.set(method, handler);
        return { dispose: () => this.handlers.delete(method) };
    }

    /** Delivers a notification as the daemon would. */
    notify(method: string, params: unknown): void {
        this.handlers.get(method)?.(params);
    }
}
