/**
 * Makes `require("vscode")` load the stand-in in `./vscode`. Import this first in
 * every test file that loads extension code which imports `vscode`.
 *
 * What the stand-in does not model resolves to an inert value: a function that can be
 * called, constructed and extended, whose properties are more of the same and whose
 * calls return a disposable. That is enough for `vscode-languageclient` to load and run
 * a client with no documents.
 */
import Module from "node:module";

import * as standIn from "./vscode";

function inert(): unknown {
    const target = function () {};
    return new Proxy(target, {
        get(t, property) {
            if (property === "prototype") {
                return t.prototype;
            }
            if (property === "then" || typeof property === "symbol") {
                return undefined;
            }
            return property === "dispose" ? () => undefined : inert();
        },
        apply: () => ({ dispose: () => undefined }),
        construct: () => ({}),
    });
}

function withInertRest<T extends object>(target: T): T {
    return new Proxy(target, {
        get(t, property, receiver) {
            if (property in t || typeof property === "symbol") {
                return Reflect.get(t, property, receiver);
            }
            return inert();
        },
    });
}

const vscodeModule = withInertRest({
    ...standIn,
    window: withInertRest(standIn.window),
    workspace: withInertRest(standIn.workspace),
});

type Resolve = (request: string, ...rest: unknown[]) => string;
const moduleWithResolve = Module as unknown as {
    _resolveFilename: Resolve;
    _cache: Record<string, unknown>;
};
const resolve = moduleWithResolve._resolveFilename;
const cacheKey = "vscode (stand-in)";
moduleWithResolve._cache[cacheKey] = {
    id: cacheKey,
    filename: cacheKey,
    loaded: true,
    exports: vscodeModule,
};

moduleWithResolve._resolveFilename = function (
    this: unknown,
    request: string,
    ...rest: unknown[]
): string {
    return request === "vscode" ? cacheKey : resolve.call(this, request, ...rest);
};
