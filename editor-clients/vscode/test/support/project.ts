/** A throwaway project for a session's `cwd`: memory files the daemon loads, and a rule that waits. */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

export interface TestProject {
    dir: string;
    /** `CLAUDE.md`: a project memory file, loaded when the session opens. */
    claudeMd: string;
    /** `.claude/rules/rust.md`: a rule with `paths: "src/**\/*.rs"`, waiting for such a read. */
    rule: string;
    /** `notes.txt`: a plain file for `ctx/fileRead`. */
    notes: string;
}

export function makeProject(): TestProject {
    // realpath: the daemon reports paths as it resolves them (/tmp may be a link).
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-project-")));
    const project: TestProject = {
        dir,
        claudeMd: path.join(dir, "CLAUDE.md"),
        rule: path.join(dir, ".claude", "rules", "rust.md"),
        notes: path.join(dir, "notes.txt"),
    };
    fs.writeFileSync(project.claudeMd, "# Project\n\nRun the tests before every commit.\n");
    fs.mkdirSync(path.dirname(project.rule), { recursive: true });
    fs.writeFileSync(
        project.rule,
        '---\npaths: "src/**/*.rs"\n---\nUse `thiserror` for error types.\n',
    );
    fs.writeFileSync(project.notes, "one\ntwo\nthree\n");
    return project;
}

/** Replaces a file's content at once (write, then rename), as editors save. */
export function writeAtomically(file: string, text: string): void {
    const temporary = `${file}.tmp-${process.pid}`;
    fs.writeFileSync(temporary, text);
    fs.renameSync(temporary, file);
}
