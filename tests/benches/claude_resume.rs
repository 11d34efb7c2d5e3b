//! Resume cost of a large Claude Code session with the real program, untouched and
//! after `ctxd claude compact`: time from launch to the first request reaching the
//! Messages API stub, and that request's size. A measurement printed, never asserted.
//!
//! ```text
//! cargo bench -p ctxd-e2e --bench claude_resume            # ~100 MB session
//! cargo bench -p ctxd-e2e --bench claude_resume -- --mb 20 # smaller
//! ```
//!
//! Runs `tests/claude-code/run --bench` (root: the program runs inside `unshare -n`
//! with only loopback up, against `tests/claude-code/stub.py` on 127.0.0.1).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // bench code: a failed step is a failed run

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let script = ctxd_e2e::repo_root().join("tests/claude-code/run");
    let status = std::process::Command::new(&script).arg("--bench").args(&args).status()?;
    anyhow::ensure!(status.success(), "{} --bench failed: {status}", script.display());
    Ok(())
}
