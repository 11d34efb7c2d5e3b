//! `ctxd-gen-session`: writes a generated Claude Code session (JSONL) to stdout or a file.
//!
//! ```text
//! ctxd-gen-session --turns 200 --seed 7 > session.jsonl
//! ctxd-gen-session --target-tokens 900000 --seed 7 --model 'claude-sonnet-4-5-20250929[1m]'
//! ctxd-gen-session --target-bytes 100000000 --compact-at 150000 --out big.jsonl
//! ctxd-gen-session --turns 50 --with-files DIR      # also write every file that is read
//! ```

#![allow(clippy::print_stderr)] // a command-line tool: usage and errors go to stderr

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use ctxd_gen::{Options, Until, time};

const USAGE: &str = "usage: ctxd-gen-session [--turns N | --target-tokens N | --target-bytes N] [--seed N]
                        [--cwd DIR] [--model ID] [--start RFC3339] [--compact-at TOKENS]
                        [--parallel P] [--errors P] [--with-files DIR] [--out FILE] [--stats]

Writes a deterministic Claude Code style session as JSONL (stdout unless --out).
Defaults: --turns 100 --seed 1 --cwd /home/dev/project --model claude-sonnet-4-5-20250929
--start 2026-11-01T09:00:00Z, no compaction, no parallel calls, no failing calls.
--stats prints what was written to stderr.";

struct Args {
    opts: Options,
    out: Option<PathBuf>,
    stats: bool,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args { opts: Options::default(), out: None, stats: false };
    while let Some(flag) = argv.next() {
        if flag == "--stats" {
            args.stats = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|_| format!("{flag}: not a whole number: {value}"));
        let probability = || match value.parse::<f64>() {
            Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(format!("{flag}: not a probability in [0, 1]: {value}")),
        };
        let o = &mut args.opts;
        match flag.as_str() {
            "--turns" => o.until = Until::Turns(number()? as usize),
            "--target-tokens" => o.until = Until::Tokens(number()?),
            "--target-bytes" => o.until = Until::Bytes(number()?),
            "--seed" => o.seed = number()?,
            "--cwd" => o.cwd = value,
            "--model" => o.model = value,
            "--start" => {
                o.start_ms = time::parse_ms(&value).ok_or(format!("--start: not YYYY-MM-DDTHH:MM:SSZ: {value}"))?
            }
            "--compact-at" => o.compact_at = Some(number()?),
            "--parallel" => o.parallel = probability()?,
            "--errors" => o.errors = probability()?,
            "--with-files" => o.files_dir = Some(value.into()),
            "--out" => args.out = Some(value.into()),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("ctxd-gen-session: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let written = match &args.out {
        Some(path) => std::fs::File::create(path).and_then(|f| ctxd_gen::write(&args.opts, &mut BufWriter::new(f))),
        None => ctxd_gen::write(&args.opts, &mut BufWriter::new(std::io::stdout().lock())),
    };
    match written {
        Ok(stats) => {
            if args.stats {
                eprintln!(
                    "{} records, {} bytes, {} turns, {} tool calls, {} compact boundaries, {} tokens, session {}",
                    stats.records,
                    stats.bytes,
                    stats.turns,
                    stats.tool_calls,
                    stats.boundaries,
                    stats.tokens,
                    stats.session_id
                );
            }
            let _ = std::io::stderr().flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ctxd-gen-session: {e}");
            ExitCode::FAILURE
        }
    }
}
