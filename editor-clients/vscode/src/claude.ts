/**
 * Claude Code sessions of the workspace, with no agent extension: the daemon is asked to
 * observe the Claude Code project folder of each workspace folder (`ctx/observe` with a
 * `projectDir`), and publishes `ctx/usageChanged` for its newest transcript and for each
 * transcript that appears later, under ids `observe-…`.
 *
 * This module knows where Claude Code keeps a folder's transcripts, which observed id
 * belongs to which transcript, and which observed session is the newest active one. It
 * does not know about `vscode`; the status bar and the commands read it.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import { Emitter } from "vscode-jsonrpc";

import type * as ext from "./lsp_ext";

/** Claude Code's configuration folder: `$CLAUDE_CONFIG_DIR`, else `~/.claude`. */
export function claudeConfigDir(
    env: NodeJS.ProcessEnv = process.env,
    home: string = os.homedir(),
): string {
    const configured = env.CLAUDE_CONFIG_DIR;
    return configured !== undefined && configured !== "" ? configured : path.join(home, ".claude");
}

/** Claude Code cuts a project folder's name at this many UTF-16 units (and adds a hash). */
const FOLDER_NAME_MAX = 200;

/**
 * The name Claude Code gives the folder of the transcripts of sessions started in `cwd`:
 * each UTF-16 unit of the path that is not an ASCII letter or digit becomes `-` (two for a
 * character outside the Basic Multilingual Plane); past 200 units the name is cut and
 * given `-` and the base-36 of the path's 32-bit string hash. The cases the real program
 * gave are pinned in `editor-clients/fixtures/claude-project-folders.json`.
 */
export function claudeProjectFolderName(cwd: string): string {
    const name = cwd.replace(/[^A-Za-z0-9]/g, "-");
    if (name.length <= FOLDER_NAME_MAX) {
        return name;
    }
    let hash = 0;
    for (let i = 0; i < cwd.length; i++) {
        hash = ((hash << 5) - hash + cwd.charCodeAt(i)) | 0;
    }
    return `${name.slice(0, FOLDER_NAME_MAX)}-${Math.abs(hash).toString(36)}`;
}

/**
 * The folder where Claude Code writes the transcripts of sessions started in `cwd`. The
 * program names it after the real path, so a workspace opened through a symlink finds
 * the sessions started in the folder it points to.
 */
export function claudeProjectDir(cwd: string, configDir: string = claudeConfigDir()): string {
    let real = cwd;
    try {
        real = fs.realpathSync(cwd);
    } catch {
        // A folder that does not exist (any more): named as given.
    }
    return path.join(configDir, "projects", claudeProjectFolderName(real));
}

/** The id the daemon publishes an observed transcript under (FNV-1a of its path). */
export function observeId(transcript: string): string {
    let hash = 0xcbf29ce484222325n;
    for (const byte of Buffer.from(transcript, "utf8")) {
        hash ^= BigInt(byte);
        hash = (hash * 0x100000001b3n) & 0xffffffffffffffffn;
    }
    return `observe-${hash.toString(16).padStart(16, "0")}`;
}

/** The transcripts' file names in a project folder (none when it cannot be read). */
function transcriptNames(dir: string): string[] {
    try {
        return fs.readdirSync(dir).filter((f) => f.endsWith(".jsonl"));
    } catch {
        return [];
    }
}

function hasTranscript(dir: string): boolean {
    return transcriptNames(dir).length > 0;
}

export function isObservedId(sessionId: string): boolean {
    return sessionId.startsWith("observe-");
}

/** The model of the latest assistant record in the transcript's last 256 KB, if any. */
export function transcriptModel(transcript: string): string | undefined {
    let fd: number | undefined;
    try {
        fd = fs.openSync(transcript, "r");
        const size = fs.fstatSync(fd).size;
        const length = Math.min(size, 256 * 1024);
        const buffer = Buffer.alloc(length);
        fs.readSync(fd, buffer, 0, length, size - length);
        const lines = buffer.toString("utf8").split("\n").reverse();
        for (const line of lines) {
            if (!line.includes('"assistant"')) {
                continue;
            }
            try {
                const model = (JSON.parse(line) as { message?: { model?: unknown } }).message
                    ?.model;
                if (typeof model === "string" && !model.startsWith("<")) {
                    return model;
                }
            } catch {
                // A line cut by the 256 KB window, or one still being written.
            }
        }
    } catch {
        return undefined;
    } finally {
        if (fd !== undefined) {
            fs.closeSync(fd);
        }
    }
    return undefined;
}

/** One Claude Code session the daemon observes for this workspace. */
export interface ObservedSession {
    sessionId: string;
    /** The workspace folder whose Claude Code project it belongs to. */
    folder: string;
    projectDir: string;
    /** The transcript, when it was found among the project's files. */
    transcript?: string;
    /** Claude Code's own session id (the transcript's file name). */
    claudeSessionId?: string;
    model?: string;
    usage?: ext.Usage;
    /** Order of the latest usage: the highest is the newest active session. */
    seen: number;
}

/** What `ObservedSessions` needs: the daemon's requests and its usage notifications. */
export interface ObserveConnection {
    request<R>(method: string, params: unknown): Promise<R>;
    onUsageChanged(listener: (params: ext.UsageChangedNotification) => void): {
        dispose(): unknown;
    };
}

/**
 * A transcript in one of the observed project folders, for the session picker: the
 * files on disk, so that every editor on the workspace lists the same sessions, with
 * the observed session when the daemon has sent its usage.
 */
export interface ListedTranscript {
    transcript: string;
    folder: string;
    projectDir: string;
    claudeSessionId: string;
    /** Last written (ms since the epoch): the list is newest first. */
    modified: number;
    session?: ObservedSession;
}

/** A folder whose Claude Code project could not be observed (yet), and why. */
export interface Unobserved {
    folder: string;
    projectDir: string;
    reason: string;
}

export class ObservedSessions {
    private readonly byId = new Map<string, ObservedSession>();
    private readonly folders = new Map<string, string>(); // projectDir → folder
    private readonly waiting = new Map<string, Unobserved>();
    private readonly watchers = new Map<string, fs.FSWatcher>();
    private counter = 0;
    /** The session the user chose to show, whatever changes later; none: the newest. */
    private pinnedId: string | undefined;
    private readonly subscription: { dispose(): unknown };
    private readonly changed = new Emitter<void>();
    /** The set or the newest session changed, or one's usage did. */
    readonly onDidChange = this.changed.event;

    constructor(
        private readonly connection: ObserveConnection,
        private readonly configDir: () => string = () => claudeConfigDir(),
        private readonly log: (line: string) => void = () => undefined,
    ) {
        this.subscription = connection.onUsageChanged(({ sessionId, usage }) => {
            if (isObservedId(sessionId)) {
                this.update(sessionId, usage);
            }
        });
    }

    /**
     * Asks the daemon to observe the Claude Code project of each folder. A project with no
     * transcript yet is watched and observed when its first transcript appears.
     */
    async observe(folders: readonly string[]): Promise<void> {
        await Promise.all(folders.map((folder) => this.observeFolder(folder)));
    }

    /** Observes again every folder known (after the daemon restarted). */
    async reobserve(): Promise<void> {
        const folders = [
            ...new Set([
                ...this.folders.values(),
                ...[...this.waiting.values()].map((w) => w.folder),
            ]),
        ];
        await this.observe(folders);
    }

    /** Every observed session, newest active first. */
    sessions(): ObservedSession[] {
        return [...this.byId.values()].sort((a, b) => b.seen - a.seen).map((s) => ({ ...s }));
    }

    newest(): ObservedSession | undefined {
        return this.sessions()[0];
    }

    /** The session the status item shows: the one the user pinned, else the newest active. */
    shown(): ObservedSession | undefined {
        return (this.pinnedId !== undefined ? this.get(this.pinnedId) : undefined) ?? this.newest();
    }

    /** The pinned session's id, if the user pinned one. */
    pinned(): string | undefined {
        return this.pinnedId;
    }

    /** Shows `sessionId` from now on, whichever session changes; `undefined` follows the newest again. */
    pin(sessionId: string | undefined): void {
        this.pinnedId = sessionId;
        this.changed.fire();
    }

    get(sessionId: string): ObservedSession | undefined {
        const s = this.byId.get(sessionId);
        return s === undefined ? undefined : { ...s };
    }

    /** Every transcript of the observed project folders, newest written first. */
    listed(): ListedTranscript[] {
        const listed: ListedTranscript[] = [];
        for (const [projectDir, folder] of this.folders) {
            for (const name of transcriptNames(projectDir)) {
                const transcript = path.join(projectDir, name);
                let modified: number;
                try {
                    modified = fs.statSync(transcript).mtimeMs;
                } catch {
                    continue; // Gone since the listing.
                }
                const session = this.get(observeId(transcript));
                listed.push({
                    transcript,
                    folder,
                    projectDir,
                    claudeSessionId: name.slice(0, -".jsonl".length),
                    modified,
                    session,
                });
            }
        }
        return listed.sort(
            (a, b) => b.modified - a.modified || a.transcript.localeCompare(b.transcript),
        );
    }

    /**
     * The observed session of a listed transcript: asks the daemon to follow that one
     * transcript when it has sent no usage for it yet (an older session it does not follow).
     */
    async follow(listed: ListedTranscript): Promise<ObservedSession> {
        const known = this.get(observeId(listed.transcript));
        if (known?.usage !== undefined) {
            return known;
        }
        const result = await this.connection.request<ext.ObserveResult>("ctx/observe", {
            transcript: listed.transcript,
        });
        this.update(result.sessionId, result.usage);
        const session = this.get(result.sessionId);
        if (session === undefined) {
            throw new Error(
                `the daemon followed ${listed.transcript} under an id this editor cannot place`,
            );
        }
        return session;
    }

    /**
     * Forgets the folders not in `keep` (a workspace folder removed, or observing turned
     * off): their sessions, watchers and reasons, and the pin if it was one of theirs. The
     * daemon keeps following them; their usage is ignored from now on.
     */
    forget(keep: readonly string[] = []): void {
        const kept = new Set(keep);
        for (const [projectDir, folder] of [...this.folders]) {
            if (kept.has(folder)) {
                continue;
            }
            this.folders.delete(projectDir);
            this.waiting.delete(projectDir);
            this.stopWatching(projectDir);
            for (const [id, session] of [...this.byId]) {
                if (session.projectDir === projectDir) {
                    this.byId.delete(id);
                }
            }
        }
        if (this.pinnedId !== undefined && !this.byId.has(this.pinnedId)) {
            this.pinnedId = undefined;
        }
        this.changed.fire();
    }

    /** Folders with no observed session, and why. */
    unobserved(): Unobserved[] {
        return [...this.waiting.values()];
    }

    dispose(): void {
        this.subscription.dispose();
        for (const w of this.watchers.values()) {
            w.close();
        }
        this.watchers.clear();
        this.changed.dispose();
    }

    /**
     * `retry`: whether a failure while a transcript exists is tried once more (the
     * transcript may have appeared just after the daemon looked). A second failure with a
     * transcript there is left waiting for the daemon's next start (`reobserve`): watching
     * a folder whose transcript already exists would ask again at once, without end.
     */
    private async observeFolder(folder: string, retry = true): Promise<void> {
        const projectDir = claudeProjectDir(folder, this.configDir());
        this.folders.set(projectDir, folder);
        try {
            const result = await this.connection.request<ext.ObserveResult>("ctx/observe", {
                projectDir,
            });
            if (this.folders.get(projectDir) !== folder) {
                return; // Forgotten meanwhile.
            }
            this.waiting.delete(projectDir);
            this.stopWatching(projectDir);
            this.log(`[ctxd client] observing Claude Code sessions of ${folder} (${projectDir})`);
            this.update(result.sessionId, result.usage);
        } catch (error) {
            if (this.folders.get(projectDir) !== folder) {
                return;
            }
            const reason = error instanceof Error ? error.message : String(error);
            this.waiting.set(projectDir, { folder, projectDir, reason });
            this.changed.fire();
            if (!hasTranscript(projectDir)) {
                this.log(`[ctxd client] no Claude Code session for ${folder} yet: ${reason}`);
                this.watchForTranscript(projectDir, folder);
            } else if (retry) {
                await this.observeFolder(folder, false);
            } else {
                this.log(
                    `[ctxd client] cannot observe the Claude Code sessions of ${folder}: ${reason}`,
                );
            }
        }
    }

    /** Watches the project folder, or the nearest folder above it that exists. */
    private watchForTranscript(projectDir: string, folder: string): void {
        if (this.watchers.has(projectDir)) {
            return;
        }
        let target = projectDir;
        while (!fs.existsSync(target) && path.dirname(target) !== target) {
            target = path.dirname(target);
        }
        const look = () => {
            if (hasTranscript(projectDir)) {
                this.stopWatching(projectDir);
                void this.observeFolder(folder);
            } else if (target !== projectDir && fs.existsSync(projectDir)) {
                // The project folder appeared: watch it instead of the folder above it.
                this.stopWatching(projectDir);
                this.watchForTranscript(projectDir, folder);
            }
        };
        try {
            const watcher = fs.watch(target, { persistent: false }, look);
            watcher.on("error", () => this.stopWatching(projectDir));
            this.watchers.set(projectDir, watcher);
        } catch {
            // Nothing to watch (no such folder and no permission): the next restart tries again.
            return;
        }
        // What appeared before the watch began.
        look();
    }

    private stopWatching(projectDir: string): void {
        this.watchers.get(projectDir)?.close();
        this.watchers.delete(projectDir);
    }

    private update(sessionId: string, usage: ext.Usage): void {
        let session = this.byId.get(sessionId);
        if (session === undefined) {
            session = this.locate(sessionId);
            if (session === undefined) {
                return; // Another workspace's project (the daemon may observe every project).
            }
            this.byId.set(sessionId, session);
        }
        session.usage = usage;
        session.seen = ++this.counter;
        if (session.transcript !== undefined) {
            session.model = transcriptModel(session.transcript) ?? session.model;
        }
        this.changed.fire();
    }

    /** Finds which of this workspace's projects holds the transcript published as `sessionId`. */
    private locate(sessionId: string): ObservedSession | undefined {
        for (const [projectDir, folder] of this.folders) {
            for (const name of transcriptNames(projectDir)) {
                const transcript = path.join(projectDir, name);
                if (observeId(transcript) === sessionId) {
                    return {
                        sessionId,
                        folder,
                        projectDir,
                        transcript,
                        claudeSessionId: name.slice(0, -".jsonl".length),
                        seen: 0,
                    };
                }
            }
        }
        return undefined;
    }
}
