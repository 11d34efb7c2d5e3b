//! The `ctxd` command: the daemon (`ctxd`, `ctxd serve`), the gateway (`ctxd gateway`)
//! and the commands around it.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use ctxd::logging::{self, LogTarget};
use ctxd::process_env::ProcessEnv;
use ctxd::replay::{self, ReplayOptions};
use ctxd::server::{self, ServeOptions};
use ctxd::transport::{self, Ending, Limits};

#[derive(Debug, Parser)]
#[command(name = "ctxd", version, about = "Context-management daemon for AI coding agents")]
struct Cli {
    /// State directory (store and logs). Default: $CTXD_STATE_DIR, else the XDG state dir
    /// ($XDG_STATE_HOME/ctxd, ~/.local/state/ctxd).
    #[arg(long, global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Log file. Default: <state dir>/logs/ctxd.log.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "log_stderr")]
    log_file: Option<PathBuf>,
    /// Log to stderr instead of a file.
    #[arg(long, global = true)]
    log_stderr: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the protocol on stdin/stdout (the default).
    Serve {
        /// Largest message accepted, in bytes.
        #[arg(long, default_value_t = 64 * 1024 * 1024)]
        max_message_bytes: usize,
    },
    /// Claude Code `statusLine` command: reads its JSON on stdin, prints one line.
    Statusline,
    /// Import a Claude Code transcript (JSONL) into the store as a new session.
    Import {
        file: PathBuf,
        /// Id of the new session (default: a new UUID).
        #[arg(long)]
        session_id: Option<String>,
    },
    /// Write a session to stdout as a Claude Code transcript.
    Export { session_id: String },
    /// Claude Code sessions in their own transcripts (~/.claude/projects).
    Claude {
        #[command(subcommand)]
        command: ClaudeCommand,
    },
    /// The gateway on the Messages API path: point Claude Code at it with
    /// `ANTHROPIC_BASE_URL=http://127.0.0.1:8417`. Forwards every request unchanged to the
    /// upstream and reads the live figures of each session from the answers; also hosts
    /// the daemon (observes Claude Code's projects, idle compaction per the settings,
    /// editors share it). Runs until SIGINT or SIGTERM.
    Gateway {
        /// Address to listen on (default: the setting `gateway.listen`, else 127.0.0.1:8417).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Where requests go (default: the setting `gateway.upstream`, else
        /// https://api.anthropic.com).
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// Listen beyond loopback (API keys pass through the gateway: only on a network
        /// you trust).
        #[arg(long)]
        allow_remote: bool,
        /// Seconds a connection may wait before sending a request (tests).
        #[arg(long, hide = true)]
        idle_seconds: Option<f64>,
        /// Prepare a session's summary once it has been idle this long (default: the
        /// setting `gateway.precomputeIdleSeconds`, else 120).
        #[arg(long = "precompute-idle", value_name = "SECONDS")]
        precompute_idle: Option<u64>,
        /// ... when its context is at least this percent of Claude Code's auto-compact
        /// threshold (default: `gateway.precomputeAtPercent`, else 60).
        #[arg(long = "precompute-at", value_name = "PERCENT", value_parser = clap::value_parser!(u64).range(0..=100))]
        precompute_at: Option<u64>,
    },
    /// MCP server on stdio: the history search for an agent (`claude mcp add ctxd -- ctxd mcp`).
    Mcp,
    /// Drive a Claude Code style transcript through the daemon and print usage per turn.
    Replay {
        /// The transcript (JSONL).
        file: PathBuf,
        /// Model id (default: the model named in the transcript).
        #[arg(long)]
        model: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum ClaudeCommand {
    /// Compact a session: append a compact boundary and a summary in Claude Code's own
    /// shapes, so `claude --resume` starts from them. The summary is written by the
    /// provider the settings for the session's project choose (the offline summarizer
    /// when they choose none, or when the provider fails). Refused (nothing written)
    /// while a process has the transcript open, or when it changed meanwhile.
    Compact {
        /// A session id (found under ~/.claude/projects) or a transcript's path.
        session: String,
        /// Focus of the summary.
        #[arg(long)]
        instructions: Option<String>,
        /// Write the summary with ctxd's own summarizer: no provider, no network.
        #[arg(long)]
        offline: bool,
    },
    /// Take ctxd's compaction of a session back: the transcript is cut to the length it
    /// had before, if nothing came after the compaction.
    Undo {
        /// A session id or a transcript's path.
        session: String,
    },
    /// Set up Claude Code for ctxd: its status line runs `ctxd statusline`, a `claude`
    /// shell function runs it through ctxd's gateway (the plain program when ctxd is
    /// gone), and `ctxd mcp` is its user MCP server (`claude mcp add -s user`). Prints
    /// what it changed; every changed file is backed up first.
    Setup {
        /// Put every file setup changed back as it was, and remove the MCP server it added.
        #[arg(long)]
        undo: bool,
        /// Leave the shell's start-up files alone (run Claude Code as `ctxd claude run`).
        #[arg(long, conflicts_with = "undo")]
        no_shell: bool,
        /// The shell start-up file for the `claude` function (default: ~/.bashrc or
        /// ~/.zshrc, after $SHELL).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["undo", "no_shell"])]
        shell_rc: Option<PathBuf>,
    },
    /// Run Claude Code through ctxd's gateway, starting the gateway when it is not
    /// running; without it (and saying why) when it cannot be had.
    Run {
        /// Arguments for `claude`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print the shell variables that send one `claude` through ctxd's gateway (starting
    /// it when needed); nothing when it cannot be had. For the `claude` function.
    Env,
    /// What instant compaction cost and saved per session on the gateway: preparations
    /// (count, tokens, dollars), compactions answered at once, the estimated savings
    /// and the net.
    Stats {
        /// A session id, or the start of one (default: every session).
        session: Option<String>,
        /// Print JSON (`{"sessions": [...]}`) instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// A session named on the command line: a path when a file is there, else an id.
fn claude_target(env: &ProcessEnv, session: &str) -> anyhow::Result<PathBuf> {
    let as_path = std::path::Path::new(session);
    let projects = env.claude_projects_dir();
    let found = if as_path.is_file() {
        ctxd::claude::resolve(projects.as_deref(), Some(session), None)
    } else {
        ctxd::claude::resolve(projects.as_deref(), None, Some(session))
    };
    found.map_err(|e| anyhow::anyhow!(e))
}

async fn claude(state_dir: &std::path::Path, env: Arc<ProcessEnv>, command: ClaudeCommand) -> anyhow::Result<ExitCode> {
    match command {
        ClaudeCommand::Compact { session, instructions, offline } => {
            let path = claude_target(&env, &session)?;
            // The user's own settings files and the project's (as a session there would
            // have them); no client here.
            let sources = ctxd::settings::SettingsSources::standard(state_dir, &env);
            let settings_for: ctxd::claude::SettingsFor = std::sync::Arc::new(move |project| {
                let home = sources.home.clone().unwrap_or_else(|| PathBuf::from("/"));
                let none = ctxd_proto::Settings::default();
                ctxd::settings::resolve(&sources, project.unwrap_or(&home), &none, &none).settings
            });
            let source = if offline {
                ctxd::claude::SummarySource::Offline(settings_for)
            } else {
                ctxd::claude::SummarySource::Configured(settings_for)
            };
            let done =
                ctxd::claude::compact(env.clone(), path, instructions, source).await.map_err(|e| anyhow::anyhow!(e))?;
            let mut stdout = std::io::stdout().lock();
            writeln!(
                stdout,
                "compacted {}: {} lines appended at byte {}, {} -> {} tokens, {} messages kept, summary by {}",
                done.transcript.display(),
                done.plan.lines.len(),
                done.offset,
                done.plan.pre_tokens,
                done.plan.post_tokens,
                done.plan.kept,
                done.summarizer.name
            )?;
            for problem in &done.problems {
                writeln!(stdout, "note: {problem}")?;
            }
        }
        ClaudeCommand::Undo { session } => {
            let mut stdout = std::io::stdout().lock();
            let path = claude_target(&env, &session)?;
            let done = ctxd::claude::undo(&path).map_err(|e| anyhow::anyhow!(e))?;
            writeln!(stdout, "undone {}: cut back to {} bytes", done.transcript.display(), done.offset)?;
        }
        ClaudeCommand::Setup { undo, no_shell, shell_rc } => {
            let targets = ctxd::setup::Targets::standard(&env, state_dir, shell_rc, no_shell)?;
            let said = if undo { ctxd::setup::undo(&targets)? } else { ctxd::setup::setup(&targets, &this_ctxd()?)? };
            let mut stdout = std::io::stdout().lock();
            for line in said {
                writeln!(stdout, "{line}")?;
            }
        }
        ClaudeCommand::Run { args } => {
            let vars = gateway_vars(&env, state_dir)?;
            return Err(ctxd::setup::exec_claude(&env, &args, &vars));
        }
        ClaudeCommand::Env => {
            let vars = gateway_vars(&env, state_dir)?;
            write!(std::io::stdout(), "{}", ctxd::setup::shell_exports(&vars))?;
        }
        ClaudeCommand::Stats { session, json } => {
            let text = ctxd::gateway::costs::stats_command(state_dir, session.as_deref(), json)
                .map_err(|e| anyhow::anyhow!(e))?;
            write!(std::io::stdout(), "{text}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The running ctxd, as the path the status line and the shell function name.
fn this_ctxd() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(std::fs::canonicalize(&exe).unwrap_or(exe))
}

/// The variables for one `claude` through the gateway; none (said on stderr) when it
/// cannot be had.
fn gateway_vars(env: &ProcessEnv, state_dir: &std::path::Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut warn = |why: &str| {
        let _ = writeln!(std::io::stderr(), "ctxd: {why}");
    };
    Ok(ctxd::setup::gateway_env(env, state_dir, &this_ctxd()?, &mut warn).unwrap_or_default())
}

fn main() -> ExitCode {
    // Everything ctxd creates (store, index, logs) is for its owner only.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    // The one read of the environment; everything below gets it from here.
    let env = Arc::new(ProcessEnv::from_process());
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::Statusline)) {
        // The fast path: no runtime, no store, no log file; stdin to one line.
        // The host writes one JSON object; a stdin that never closes (or never ends)
        // costs at most a second and a megabyte.
        let whole = |b: &[u8]| serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok();
        let input = ctxd::outside::read_stream(std::io::stdin(), 1 << 20, std::time::Duration::from_secs(1), whole);
        let _ = writeln!(std::io::stdout(), "{}", ctxd::statusline::run(&String::from_utf8_lossy(&input), &env));
        return ExitCode::SUCCESS;
    }
    // A panic is logged (stderr is not the protocol, but the log is where people look);
    // the transport turns it into an error reply for the request that caused it.
    std::panic::set_hook(Box::new(|info| tracing::error!(%info, "panic")));
    let state_dir = cli.state_dir.clone().unwrap_or_else(|| env.default_state_dir());
    let serving = matches!(cli.command, None | Some(Command::Serve { .. }) | Some(Command::Gateway { .. }));
    let target = match (&cli.log_file, cli.log_stderr) {
        (Some(file), _) => LogTarget::File(file.clone()),
        (None, true) => LogTarget::Stderr,
        // Commands other than the daemon log to stderr unless told otherwise.
        // Only in a state directory that is this user's alone (else `initialize` says why).
        (None, false) if serving && ctxd::store::StateDir::open(&state_dir).is_ok() => {
            LogTarget::File(state_dir.join("logs").join("ctxd.log"))
        }
        (None, false) if serving => LogTarget::Stderr,
        (None, false) => LogTarget::Stderr,
    };
    let default_level = if serving { "info" } else { "warn" };
    let _guard = match logging::init(&target, env.log_filter(), default_level) {
        Ok(guard) => guard,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "ctxd: {e}");
            return ExitCode::from(2);
        }
    };
    if serving {
        raise_open_file_limit();
    }
    if serving || matches!(cli.command, Some(Command::Replay { .. })) {
        for warning in env.budget_warnings() {
            tracing::warn!(%warning, "ignoring an invalid environment variable");
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "ctxd: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            None => serve(state_dir, env, Limits::default()).await,
            Some(Command::Serve { max_message_bytes }) => {
                serve(state_dir, env, Limits { max_message_bytes, ..Limits::default() }).await
            }
            Some(Command::Statusline) => Ok(ExitCode::SUCCESS),
            Some(Command::Gateway { listen, upstream, allow_remote, idle_seconds, precompute_idle, precompute_at }) => {
                let idle = idle_seconds.filter(|s| s.is_finite() && *s > 0.0).map(std::time::Duration::from_secs_f64);
                let options = ctxd::gateway::host::Options {
                    state_dir,
                    env,
                    listen,
                    upstream,
                    allow_remote,
                    idle,
                    precompute_idle,
                    precompute_at,
                };
                ctxd::gateway::host::run(options, |at| {
                    // The one line on stdout: where to point Claude Code (scripts read it).
                    let mut stdout = std::io::stdout().lock();
                    let _ = writeln!(stdout, "ctxd gateway listening on http://{at}");
                    let _ = stdout.flush();
                })
                .await
                .map(|()| ExitCode::SUCCESS)
            }
            Some(Command::Import { file, session_id }) => import(&state_dir, &file, session_id),
            Some(Command::Export { session_id }) => {
                let mut stdout = std::io::stdout().lock();
                ctxd::interop::export(&state_dir, &session_id, &mut stdout)?;
                Ok(ExitCode::SUCCESS)
            }
            Some(Command::Claude { command }) => claude(&state_dir, env, command).await,
            Some(Command::Mcp) => ctxd::mcp::run(state_dir, env).await.map(|()| ExitCode::SUCCESS),
            Some(Command::Replay { file, model }) => {
                let options = ReplayOptions { transcript: file, model, state_dir: cli.state_dir, env };
                let mut stdout = std::io::stdout().lock();
                replay::run(options, &mut stdout).await.map(|()| ExitCode::SUCCESS)
            }
        }
    });
    // Pending blocking tasks (a stuck disk) must not hold the process open after exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %e, "ctxd failed");
            let _ = writeln!(std::io::stderr(), "ctxd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(state_dir: PathBuf, env: Arc<ProcessEnv>, limits: Limits) -> anyhow::Result<ExitCode> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), pid = std::process::id(), "ctxd starting");
    let dir = state_dir.clone();
    let lock = match tokio::task::spawn_blocking(move || ctxd::shared::claim(&dir)).await? {
        ctxd::shared::Claim::Daemon(lock) => lock,
        ctxd::shared::Claim::Relay(stream) => {
            let daemon_left = tokio::task::spawn_blocking(move || ctxd::shared::relay(stream)).await??;
            if daemon_left {
                tracing::info!("the daemon this editor shared went away");
            }
            // The editor restarts a relay whose daemon left, as after a crash.
            return Ok(if daemon_left { ExitCode::from(1) } else { ExitCode::SUCCESS });
        }
    };
    // Other editors may connect from now on; they wait for this one's `initialize`.
    let guests = ServeOptions { state_dir: state_dir.clone(), env: env.clone(), sharing: None };
    let listener = lock.as_ref().and_then(|lock| ctxd::shared::Listener::start(lock.dir(), guests));
    let sharing =
        Arc::new(server::Sharing { lock: std::sync::Mutex::new(lock), listener: std::sync::Mutex::new(listener) });
    let options = ServeOptions { state_dir, env, sharing: Some(sharing.clone()) };
    let (server, outflow) = server::Server::new(options);
    let ending = transport::serve_stdio(std::sync::Arc::new(server), limits, outflow).await;
    ctxd::shared::stop_listening(&sharing);
    tracing::info!(?ending, "ctxd stopping");
    // LSP: exit without a prior shutdown ends with code 1.
    Ok(match ending {
        Ending::ExitWithoutShutdown => ExitCode::from(1),
        Ending::ExitAfterShutdown | Ending::InputClosed => ExitCode::SUCCESS,
    })
}

fn import(state_dir: &std::path::Path, file: &std::path::Path, session_id: Option<String>) -> anyhow::Result<ExitCode> {
    let store = ctxd::store::Store::open(state_dir)?;
    let id = session_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let imported = ctxd::interop::import(&store, &id, file)?;
    let mut err = std::io::stderr().lock();
    for line in &imported.skipped {
        writeln!(err, "skipped {line}")?;
    }
    writeln!(
        std::io::stdout(),
        "imported {} records from {} as session {id} ({} lines skipped, {} repaired)",
        imported.records,
        file.display(),
        imported.skipped.len(),
        imported.repaired
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Each open session keeps its transcript open, and watchers take descriptors too: the
/// soft limit (often 1,024) would stop a daemon with many sessions long before the hard
/// limit the system allows. Raised once at start; past the hard limit an open fails
/// with "Too many open files", named in the error the client gets.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => tracing::debug!(from = ?limit.current, to = ?limit.maximum, "open file limit raised"),
            Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
        }
    }
}
