/**
 * "Search this session's history": a search over everything a session said, read and
 * ran, its compacted past included (`ctx/searchHistory`), its hits in a quick pick,
 * and the chosen record opened whole with its neighbours (`ctx/readHistory`) as a
 * read-only document. The session is the argument, the Claude Code session the daemon
 * observes for the workspace, or one the extension opened (a pick when there are
 * several). A failed request becomes one error message; the command never throws.
 */
import * as vscode from "vscode";

import type { ObservedSession, ObservedSessions } from "./claude";
import { isObservedId } from "./claude";
import { describeError } from "./errors";
import type { HistoryHit, ReadHistoryResult, SearchHistoryResult } from "./lsp_ext";
import type { CtxdSessions } from "./sessions";

export const SEARCH_HISTORY_COMMAND = "ctxd.searchHistory";
/** The scheme of the read-only documents a record opens in. */
export const HISTORY_SCHEME = "ctxd-history";

export interface HistoryDeps {
    sessions: CtxdSessions;
    observed?: ObservedSessions;
}

/** A session to search: the id the daemon takes and how to name it to the user. */
interface Target {
    sessionId: string;
    label: string;
}

/** The documents of the records opened, by URI path. */
export class HistoryDocuments implements vscode.TextDocumentContentProvider {
    private readonly texts = new Map<string, string>();

    set(read: ReadHistoryResult): vscode.Uri {
        const target = read.records.find((r) => r.target) ?? read.records[0];
        const uri = vscode.Uri.from({
            scheme: HISTORY_SCHEME,
            path: `/${read.sessionId}/${target?.uuid ?? "record"}.md`,
        });
        this.texts.set(uri.path, renderRecord(read));
        return uri;
    }

    provideTextDocumentContent(uri: vscode.Uri): string {
        return this.texts.get(uri.path) ?? "";
    }
}

/** Registers the command and its documents; dispose the result to unregister them. */
export function registerHistory(deps: HistoryDeps): vscode.Disposable[] {
    const documents = new HistoryDocuments();
    return [
        vscode.workspace.registerTextDocumentContentProvider(HISTORY_SCHEME, documents),
        vscode.commands.registerCommand(SEARCH_HISTORY_COMMAND, (arg?: unknown) =>
            searchHistory(deps, documents, arg),
        ),
    ];
}

export async function searchHistory(
    deps: HistoryDeps,
    documents: HistoryDocuments,
    arg?: unknown,
): Promise<void> {
    const target = await pickTarget(deps, arg);
    if (target === undefined) {
        return;
    }
    const query = await vscode.window.showInputBox({
        title: `ctxd: Search the history of ${target.label}`,
        prompt: 'Words to find ("an exact phrase" in quotes); the compacted past is searched too',
    });
    if (query === undefined || query.trim() === "") {
        return;
    }
    let found: SearchHistoryResult;
    try {
        found = await deps.sessions.request<SearchHistoryResult>("ctx/searchHistory", {
            query,
            sessionId: target.sessionId,
            limit: 50,
        });
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/searchHistory", error));
        return;
    }
    if (found.hits.length === 0) {
        const notes = found.notes?.length ? ` (${found.notes.join("; ")})` : "";
        void vscode.window.showInformationMessage(
            `ctxd: nothing found for ${JSON.stringify(query)}${notes}.`,
        );
        return;
    }
    const picked = await vscode.window.showQuickPick(
        found.hits.map((hit) => ({ ...hitItem(hit), hit })),
        {
            title: `ctxd: ${found.hits.length} hits for ${JSON.stringify(query)}`,
            matchOnDescription: true,
            matchOnDetail: true,
        },
    );
    if (picked === undefined) {
        return;
    }
    let read: ReadHistoryResult;
    try {
        read = await deps.sessions.request<ReadHistoryResult>("ctx/readHistory", {
            sessionId: picked.hit.sessionId,
            uuid: picked.hit.uuid,
        });
    } catch (error) {
        void vscode.window.showErrorMessage(describeError("ctx/readHistory", error));
        return;
    }
    const document = await vscode.workspace.openTextDocument(documents.set(read));
    await vscode.window.showTextDocument(document, { preview: true });
}

/** How a hit shows in the quick pick. */
export function hitItem(hit: HistoryHit): { label: string; description: string; detail: string } {
    const when = hit.timestamp ? hit.timestamp.replace("T", " ").replace(/\.\d+Z$|Z$/, "") : "";
    return {
        label: hit.snippet.replace(/\s+/g, " ").slice(0, 120),
        description: [hit.role.replace("_", " "), hit.beforeCompaction ? "before compaction" : ""]
            .filter(Boolean)
            .join(" · "),
        detail: [when, hit.uuid].filter(Boolean).join("  "),
    };
}

/** A record and its neighbours as Markdown, the record asked for marked. */
export function renderRecord(read: ReadHistoryResult): string {
    const parts = [`# History of ${read.sessionId}`, "", `\`${read.transcript}\``];
    for (const r of read.records) {
        const marks = [
            r.beforeCompaction ? "before compaction" : "",
            r.target ? "the record found" : "",
        ].filter(Boolean);
        parts.push(
            "",
            `## ${r.target ? "▶ " : ""}${r.role.replace("_", " ")}${r.timestamp ? ` · ${r.timestamp}` : ""}`,
        );
        parts.push(
            `\`${r.uuid}\`${marks.length ? ` (${marks.join(", ")})` : ""}`,
            "",
            "````text",
            r.text,
            "````",
        );
    }
    if (read.truncated) {
        parts.push("", `> ${read.truncated}`);
    }
    return `${parts.join("\n")}\n`;
}

async function pickTarget(deps: HistoryDeps, arg: unknown): Promise<Target | undefined> {
    const observed = deps.observed?.sessions() ?? [];
    const open = deps.sessions.sessions();
    if (typeof arg === "string" && arg !== "") {
        const seen = isObservedId(arg) ? observed.find((s) => s.sessionId === arg) : undefined;
        return seen !== undefined ? observedTarget(seen) : { sessionId: arg, label: arg };
    }
    const targets: Target[] = [
        ...observed.map(observedTarget),
        ...open.map((s) => ({ sessionId: s.sessionId, label: `session ${s.sessionId}` })),
    ];
    if (targets.length === 0) {
        void vscode.window.showWarningMessage(
            "ctxd: no session to search: no Claude Code session was found for this workspace, and no agent opened one.",
        );
        return undefined;
    }
    if (targets.length === 1) {
        return targets[0];
    }
    const picked = await vscode.window.showQuickPick(
        targets.map((t, i) => ({
            label: t.label,
            description: i === 0 ? "newest" : undefined,
            target: t,
        })),
        { placeHolder: "Whose history?" },
    );
    return picked?.target;
}

/** A Claude Code session by its own id when known (the daemon finds its transcript). */
function observedTarget(s: ObservedSession): Target {
    const id = s.claudeSessionId ?? s.sessionId;
    return { sessionId: id, label: `Claude Code session ${id.slice(0, 8)}` };
}
