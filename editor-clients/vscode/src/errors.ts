/**
 * Turning a failed request into one sentence a person can act on. Methods the daemon
 * does not have yet answer -32601; that case names the method and says the daemon is
 * too old, instead of surfacing a bare "unknown method".
 */
import { ErrorCodes } from "./lsp_ext";

/** The code of a JSON-RPC error, when `error` is one. */
export function errorCode(error: unknown): number | undefined {
    if (typeof error === "object" && error !== null && "code" in error) {
        const code = (error as { code: unknown }).code;
        return typeof code === "number" ? code : undefined;
    }
    return undefined;
}

function errorMessage(error: unknown): string {
    if (error instanceof Error) {
        return error.message;
    }
    if (typeof error === "object" && error !== null && "message" in error) {
        return String((error as { message: unknown }).message);
    }
    return String(error);
}

/** True when the daemon answered "unknown method" (it does not implement `method`). */
export function isMethodNotFound(error: unknown): boolean {
    return errorCode(error) === ErrorCodes.MethodNotFound;
}

/** One line describing why `method` failed. */
export function describeError(method: string, error: unknown): string {
    const code = errorCode(error);
    switch (code) {
        case ErrorCodes.MethodNotFound:
            return `ctxd does not support ${method} yet (error ${code}: ${errorMessage(error)}). Update ctxd to use this command.`;
        case ErrorCodes.UnknownSession:
            return `${method} failed: ${errorMessage(error)}`;
        case undefined:
            return `${method} failed: ${errorMessage(error)}`;
        default:
            return `${method} failed (error ${code}): ${errorMessage(error)}`;
    }
}
