//! The gateway part of `ctxd claude setup`: a `claude` shell function in the user's
//! shell start-up file (`~/.bashrc`, `~/.zshrc`), between marker lines, so that it goes
//! in once, is replaced when ctxd moved, and comes out whole with `--undo` however the
//! rest of the file changed since. Also the POSIX quoting every command line setup
//! writes for a shell uses.

use std::path::{Path, PathBuf};

use crate::process_env::ProcessEnv;

/// Marks the shell function's block.
const BLOCK_START: &str = "# >>> ctxd claude setup >>>";
const BLOCK_END: &str = "# <<< ctxd claude setup <<<";

/// The start-up file of the user's shell, or why there is none.
pub(super) fn default_shell_rc(env: &ProcessEnv) -> (Option<PathBuf>, Option<String>) {
    let shell = env.var("SHELL").unwrap_or_default();
    let name = Path::new(shell).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let home = env.home();
    match (name, home) {
        ("bash", Some(home)) => (Some(home.join(".bashrc")), None),
        ("zsh", Some(home)) => {
            let dir = env.var("ZDOTDIR").filter(|d| !d.is_empty()).map_or(home, PathBuf::from);
            (Some(dir.join(".zshrc")), None)
        }
        _ => (
            None,
            Some(format!(
                "no shell function for the shell {shell:?} (bash and zsh are set up; --shell-rc FILE names a \
                 file of another POSIX shell): run Claude Code as `ctxd claude run` to go through the gateway"
            )),
        ),
    }
}

/// The shell function's block, with the line break that ends it.
pub fn shell_block(ctxd: &Path, state_dir: &Path) -> String {
    let ctxd = shell_quote(&ctxd.to_string_lossy());
    let state = shell_quote(&state_dir.to_string_lossy());
    format!(
        "{BLOCK_START}\n\
         # Claude Code through ctxd's gateway while ctxd is installed and the gateway can run;\n\
         # the plain program otherwise. Taken out by `ctxd claude setup --undo`.\n\
         claude() {{\n\
         \x20   local ctxd_env=\n\
         \x20   if [ -x {ctxd} ]; then ctxd_env=\"$({ctxd} --state-dir {state} claude env)\" || ctxd_env=; fi\n\
         \x20   if [ -n \"$ctxd_env\" ]; then\n\
         \x20       (eval \"$ctxd_env\"; exec claude \"$@\")\n\
         \x20   else\n\
         \x20       command claude \"$@\"\n\
         \x20   fi\n\
         }}\n\
         {BLOCK_END}\n"
    )
}

/// `text` in single quotes for a POSIX shell.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `text` with the shell block in it: appended, or in place of an older one (setup run
/// again from a ctxd installed elsewhere); `None` when it is there already.
pub(super) fn add_block(text: &str, block: &str) -> Option<String> {
    if text.contains(block) {
        return None;
    }
    if let Some((start, end)) = block_span(text) {
        return Some(format!("{}{block}{}", &text[..start], &text[end..]));
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(block);
    Some(out)
}

/// Where the one shell block between the markers is (its final line break included);
/// `None` when there is not exactly one.
fn block_span(text: &str) -> Option<(usize, usize)> {
    let start = text.find(BLOCK_START)?;
    if text[start + 1..].contains(BLOCK_START) {
        return None;
    }
    let mut end = start + text[start..].find(BLOCK_END)? + BLOCK_END.len();
    if text[end..].starts_with('\n') {
        end += 1;
    }
    Some((start, end))
}

/// `text` without the one shell block (and the blank line setup put before it); `None`
/// when there is not exactly one.
pub(super) fn remove_block(text: &str) -> Option<String> {
    let (mut begin, end) = block_span(text)?;
    if text[..begin].ends_with("\n\n") {
        begin -= 1;
    }
    Some(format!("{}{}", &text[..begin], &text[end..]))
}

/// `export NAME='value'` lines for `eval` in a shell.
pub fn shell_exports(vars: &[(String, String)]) -> String {
    vars.iter().map(|(name, value)| format!("export {name}={}\n", shell_quote(value))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shell_block_goes_in_once_and_comes_out_whole() {
        let block = shell_block(Path::new("/u/bin/ctxd"), Path::new("/u/state"));
        let rc = "export PATH=$HOME/bin:$PATH\nalias ll='ls -l'";
        let with = add_block(rc, &block).unwrap();
        assert!(with.starts_with("export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\n\n# >>> ctxd"), "{with}");
        assert_eq!(add_block(&with, &block), None);
        // Set up again from a ctxd installed elsewhere: the block is replaced, not doubled.
        let moved = shell_block(Path::new("/opt/ctxd"), Path::new("/u/state"));
        let again = add_block(&format!("{with}export AFTER=1\n"), &moved).unwrap();
        assert_eq!(again.matches(BLOCK_START).count(), 1);
        assert!(
            again.contains("'/opt/ctxd' --state-dir")
                && again.ends_with("# <<< ctxd claude setup <<<\nexport AFTER=1\n"),
            "{again}"
        );
        // The user added a line after it: the block comes out, their line stays.
        let edited = format!("{with}echo hi\n");
        assert_eq!(remove_block(&edited).unwrap(), "export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\necho hi\n");
        assert_eq!(remove_block(rc), None);
    }

    #[test]
    fn quoting_for_the_shell() {
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let exports = shell_exports(&[("ANTHROPIC_BASE_URL".to_owned(), "http://127.0.0.1:8417".to_owned())]);
        assert_eq!(exports, "export ANTHROPIC_BASE_URL='http://127.0.0.1:8417'\n");
    }
}
