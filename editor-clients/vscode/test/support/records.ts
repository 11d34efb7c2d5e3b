/** Transcript records shaped like Claude Code's, for appending in tests. */
import { randomUUID } from "node:crypto";

import type { TranscriptRecord } from "../../src/lsp_ext";

export function userRecord(text: string, parentUuid: string | null = null): TranscriptRecord {
    return {
        type: "user",
        uuid: randomUUID(),
        parentUuid,
        message: { role: "user", content: text },
    };
}

/** An assistant turn whose provider usage puts the context at `contextTokens`. */
export function assistantRecord(
    contextTokens: number,
    parentUuid: string | null = null,
): TranscriptRecord {
    return {
        type: "assistant",
        uuid: randomUUID(),
        parentUuid,
        message: {
            role: "assistant",
            content: [{ type: "text", text: "done" }],
            usage: {
                input_tokens: 10,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: contextTokens - 60,
                output_tokens: 50,
            },
        },
    };
}
