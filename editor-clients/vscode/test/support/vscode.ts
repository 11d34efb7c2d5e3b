/**
 * A small stand-in for the `vscode` module: the API surface the extension itself uses
 * (status bar, context view, commands, settings, output channel). Calls are recorded in
 * `fake`, and tests queue the answers of input boxes, quick picks and message buttons
 * there.
 *
 * `installVscode.ts` makes `require("vscode")` return this module, wrapped so that
 * anything not modelled here (what `vscode-languageclient` touches while it loads and
 * starts: `CompletionItem`, `languages`, …) is an inert stand-in.
 */

type Listener<T> = (value: T) => unknown;

export class Disposable {
    constructor(private readonly onDispose: () => unknown) {}
    static from(...items: { dispose(): unknown }[]): Disposable {
        return new Disposable(() => items.forEach((i) => i.dispose()));
    }
    dispose(): void {
        this.onDispose();
    }
}

export class EventEmitter<T> {
    private listeners: Listener<T>[] = [];
    readonly event = (listener: Listener<T>): Disposable => {
        this.listeners.push(listener);
        return new Disposable(() => {
            this.listeners = this.listeners.filter((l) => l !== listener);
        });
    };
    fire(value: T): void {
        for (const l of [...this.listeners]) {
            l(value);
        }
    }
    dispose(): void {
        this.listeners = [];
    }
}

export class ThemeColor {
    constructor(readonly id: string) {}
}

export class MarkdownString {
    constructor(readonly value: string = "") {}
}

export enum StatusBarAlignment {
    Left = 1,
    Right = 2,
}

export enum ProgressLocation {
    SourceControl = 1,
    Window = 10,
    Notification = 15,
}

export class Uri {
    private constructor(
        readonly scheme: string,
        readonly path: string,
    ) {}
    static from(parts: { scheme: string; path?: string }): Uri {
        return new Uri(parts.scheme, parts.path ?? "");
    }
    static file(p: string): Uri {
        return new Uri("file", p);
    }
    get fsPath(): string {
        return this.path;
    }
    toString(): string {
        return `${this.scheme}:${this.path}`;
    }
}

export class FakeStatusBarItem {
    /** Every text the item showed, oldest first. */
    readonly texts: string[] = [];
    get text(): string {
        return this.texts.at(-1) ?? "";
    }
    set text(value: string) {
        this.texts.push(value);
    }
    tooltip: string | MarkdownString | undefined;
    /** The tooltip's text, plain or markdown alike (`String()` of markdown is `[object Object]`). */
    get tooltipText(): string {
        return this.tooltip instanceof MarkdownString ? this.tooltip.value : (this.tooltip ?? "");
    }
    backgroundColor: ThemeColor | undefined;
    name: string | undefined;
    command: unknown;
    visible = false;
    disposed = false;
    constructor(
        readonly id: string,
        readonly alignment: StatusBarAlignment,
        readonly priority: number,
    ) {}
    show(): void {
        this.visible = true;
    }
    hide(): void {
        this.visible = false;
    }
    dispose(): void {
        this.disposed = true;
        this.visible = false;
    }
}

export interface FakeNotification {
    title: string;
    message: string;
    open: boolean;
    /** The user closes it (its Cancel button). */
    cancel(): void;
}

export interface FakeDocument {
    uri: Uri;
    getText(): string;
}

interface ContentProvider {
    provideTextDocumentContent(uri: Uri): string;
}

/** What the extension did, and the answers it will get. */
export const fake = {
    statusBarItems: [] as FakeStatusBarItem[],
    messages: [] as { kind: "info" | "warning" | "error"; text: string }[],
    /** Answers of `showInputBox`, in order; `undefined` is a dismissed box. */
    inputAnswers: [] as (string | undefined)[],
    inputBoxes: [] as { title?: string; prompt?: string; validateInput?: (v: string) => unknown }[],
    /** Picks the quick pick item (default: the first). */
    quickPick: (items: unknown[]) => items[0],
    /** The button `showWarningMessage` etc. answer with. */
    messageAnswer: undefined as string | undefined,
    shownDocuments: [] as FakeDocument[],
    contentProviders: new Map<string, ContentProvider>(),
    commands: new Map<string, (...args: unknown[]) => unknown>(),
    progressTitles: [] as string[],
    /** Progress notifications: their title, last message, and whether still on screen. */
    notifications: [] as FakeNotification[],
    outputShown: 0,
    config: {} as Record<string, unknown>,
    outputChannels: [] as { name: string; lines: string[] }[],
    configurationChanged: new EventEmitter<{ affectsConfiguration(section: string): boolean }>(),
    /** The workspace folders' paths. */
    workspaceFolders: undefined as string[] | undefined,
    reset(): void {
        this.workspaceFolders = undefined;
        this.statusBarItems = [];
        this.messages = [];
        this.inputAnswers = [];
        this.inputBoxes = [];
        this.quickPick = (items: unknown[]) => items[0];
        this.messageAnswer = undefined;
        this.shownDocuments = [];
        this.contentProviders = new Map();
        this.commands = new Map();
        this.progressTitles = [];
        this.notifications = [];
        this.outputShown = 0;
        this.config = {};
        this.outputChannels = [];
        this.configurationChanged = new EventEmitter();
    },
};

function message(kind: "info" | "warning" | "error") {
    return async (text: string, ..._rest: unknown[]): Promise<string | undefined> => {
        fake.messages.push({ kind, text });
        return fake.messageAnswer;
    };
}

export const window = {
    createStatusBarItem(
        id: string,
        alignment: StatusBarAlignment,
        priority: number,
    ): FakeStatusBarItem {
        const item = new FakeStatusBarItem(id, alignment, priority);
        fake.statusBarItems.push(item);
        return item;
    },
    createOutputChannel(name: string) {
        const channel = {
            name,
            lines: [] as string[],
            append(text: string) {
                this.lines.push(text);
            },
            appendLine(text: string) {
                this.lines.push(text);
            },
            trace(text: string) {
                this.lines.push(`[trace] ${text}`);
            },
            debug(text: string) {
                this.lines.push(`[debug] ${text}`);
            },
            info(text: string) {
                this.lines.push(`[info] ${text}`);
            },
            warn(text: string) {
                this.lines.push(`[warn] ${text}`);
            },
            error(text: string) {
                this.lines.push(`[error] ${text}`);
            },
            logLevel: 2,
            onDidChangeLogLevel: () => new Disposable(() => undefined),
            show() {
                fake.outputShown += 1;
            },
            clear() {},
            dispose() {},
        };
        fake.outputChannels.push(channel);
        return channel;
    },
    async showInputBox(options: {
        title?: string;
        prompt?: string;
        validateInput?: (v: string) => unknown;
    }) {
        fake.inputBoxes.push(options);
        return fake.inputAnswers.shift();
    },
    async showQuickPick(items: unknown[]) {
        return fake.quickPick(items);
    },
    showInformationMessage: message("info"),
    showWarningMessage: message("warning"),
    showErrorMessage: message("error"),
    async withProgress<R>(
        options: { title?: string; location?: ProgressLocation },
        task: (
            progress: { report(v: { message?: string }): void },
            token: { onCancellationRequested(l: () => void): Disposable },
        ) => Promise<R>,
    ): Promise<R> {
        fake.progressTitles.push(options.title ?? "");
        const cancelled = new EventEmitter<void>();
        const notification: FakeNotification = {
            title: options.title ?? "",
            message: "",
            open: options.location === ProgressLocation.Notification,
            cancel: () => cancelled.fire(),
        };
        fake.notifications.push(notification);
        try {
            return await task(
                { report: (v) => (notification.message = v.message ?? notification.message) },
                { onCancellationRequested: (l) => cancelled.event(l) },
            );
        } finally {
            notification.open = false;
        }
    },
    async showTextDocument(document: FakeDocument): Promise<void> {
        fake.shownDocuments.push(document);
    },
};

export const workspace = {
    registerTextDocumentContentProvider(scheme: string, provider: ContentProvider): Disposable {
        fake.contentProviders.set(scheme, provider);
        return new Disposable(() => fake.contentProviders.delete(scheme));
    },
    async openTextDocument(uri: Uri): Promise<FakeDocument> {
        return {
            uri,
            getText() {
                const provider = fake.contentProviders.get(uri.scheme);
                if (provider === undefined) {
                    throw new Error(`no content provider for ${uri.scheme}`);
                }
                return provider.provideTextDocumentContent(uri);
            },
        };
    },
    getConfiguration(_section: string) {
        return { get: (key: string) => fake.config[key] };
    },
    onDidChangeConfiguration(
        listener: (e: { affectsConfiguration(section: string): boolean }) => unknown,
    ): Disposable {
        return fake.configurationChanged.event(listener);
    },
    get workspaceFolders() {
        return fake.workspaceFolders?.map((p, index) => ({ uri: Uri.file(p), name: p, index }));
    },
};

export const version = "1.91.0";

export const env = {
    appName: "stand-in",
    language: "en",
    machineId: "test",
    sessionId: "test",
    uriScheme: "vscode",
};

export const commands = {
    registerCommand(id: string, handler: (...args: unknown[]) => unknown): Disposable {
        if (fake.commands.has(id)) {
            throw new Error(`command ${id} registered twice`);
        }
        fake.commands.set(id, handler);
        return new Disposable(() => fake.commands.delete(id));
    },
    async executeCommand(id: string, ...args: unknown[]): Promise<unknown> {
        const handler = fake.commands.get(id);
        if (handler === undefined) {
            throw new Error(`command ${id} not found`);
        }
        return handler(...args);
    },
};
