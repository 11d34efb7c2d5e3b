/**
 * The daemon logs to stderr with `tracing`'s plain format
 * (`2026-11-29T21:57:40.060152Z  INFO ctxd: message`). These lines go to the `ctxd`
 * log output channel at the level each line names.
 */
export type LogLineLevel = "trace" | "debug" | "info" | "warn" | "error";

const LEVELS: Record<string, LogLineLevel> = {
    TRACE: "trace",
    DEBUG: "debug",
    INFO: "info",
    WARN: "warn",
    ERROR: "error",
};

/** The level of one log line and its text without the timestamp and level (the channel adds its own). */
export function parseLogLine(line: string): { level: LogLineLevel; text: string } {
    const match = /^\S+\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s+(.*)$/.exec(line);
    if (match === null) {
        // Not a tracing line (a panic message, say): show it as an error.
        return { level: "error", text: line };
    }
    return { level: LEVELS[match[1]], text: match[2] };
}
