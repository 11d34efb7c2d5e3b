// A minimal agent extension on ctxd (see ../../API.md). An agent would send the
// assembled request to its model and append the model's answer; this example makes the
// answer up, so it runs with no provider and no key.
"use strict";
const vscode = require("vscode");
const { randomUUID } = require("crypto");

const MODEL = "claude-sonnet-4-5-20250929";

/** @param {vscode.ExtensionContext} context */
async function activate(context) {
    const log = vscode.window.createOutputChannel("ctxd example host");
    // 1. The ctxd extension's API (activating it if needed).
    const ctxd = await vscode.extensions.getExtension("ctxd.ctxd").activate();
    let sessionId;
    let last = null;
    let turns = 0;

    // 4. React to the daemon: usage for a status of your own, compactions to tell the user.
    context.subscriptions.push(
        log,
        ctxd.onCompacted((e) => {
            if (e.sessionId === sessionId) {
                log.appendLine(
                    `compacted (${e.trigger}): ${e.preTokens} -> ${e.postTokens} tokens`,
                );
            }
        }),
        vscode.commands.registerCommand("ctxdExampleHost.turn", async () => {
            // 2. One session per conversation, in the folder the agent works in.
            if (sessionId === undefined) {
                const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath ?? process.cwd();
                ({ sessionId } = await ctxd.openSession({ cwd, model: MODEL }));
                log.appendLine(`opened session ${sessionId}`);
            }
            // 3. Append the turn's records (durable when the promise settles), then ask for the
            //    next request: a body for the Messages API, already compacted when needed.
            turns += 1;
            const user = {
                type: "user",
                uuid: randomUUID(),
                parentUuid: last,
                message: { role: "user", content: `step ${turns}` },
            };
            const assistant = {
                type: "assistant",
                uuid: randomUUID(),
                parentUuid: user.uuid,
                message: {
                    role: "assistant",
                    model: MODEL,
                    content: [{ type: "text", text: `done with step ${turns}` }],
                    usage: {
                        input_tokens: 12000 * turns - 40,
                        cache_creation_input_tokens: 0,
                        cache_read_input_tokens: 0,
                        output_tokens: 40,
                    },
                },
            };
            last = assistant.uuid;
            const { usage } = await ctxd.append(sessionId, [user, assistant]);
            const next = await ctxd.nextRequest({
                sessionId,
                system: [{ type: "text", text: "You are a careful agent." }],
                tools: [],
                maxTokens: 4096,
            });
            log.appendLine(
                `turn ${turns}: ${usage.tokens} tokens (${usage.percentUsed.toFixed(1)}%), next request has ${next.request.messages.length} messages`,
            );
        }),
    );
}

function deactivate() {}

module.exports = { activate, deactivate };
