/** Finding the daemon a test's LanguageClient started: a child of this process. */
import * as fs from "node:fs";

/** Pids of this process's children whose command name is `name` (Linux /proc). */
export function childPids(name: string): number[] {
    const pids: number[] = [];
    for (const entry of fs.readdirSync("/proc")) {
        if (!/^\d+$/.test(entry)) {
            continue;
        }
        try {
            const stat = fs.readFileSync(`/proc/${entry}/stat`, "utf8");
            // pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
            const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
            const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
            if (ppid === process.pid && comm === name) {
                pids.push(Number(entry));
            }
        } catch {
            // The process ended while we looked.
        }
    }
    return pids;
}
