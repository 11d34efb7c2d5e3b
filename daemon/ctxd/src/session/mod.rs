//! Open sessions: a registry of actors, one per session.
//!
//! Every method here is synchronous up to the point where the command is queued on the
//! actor, and returns the receiver of the answer. Protocol handlers call them before
//! their first `.await`, which is what keeps one session's commands in the order the
//! client sent them.

pub mod actor;
pub mod compaction;
mod error;
mod notify;
pub mod observe;
mod setup;
pub mod usage;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use ctxd_core::budget::{ResolvedWindow, Thresholds, WindowInputs, WindowSource, resolve_window, thresholds};
use ctxd_core::record::Record;
use ctxd_proto as proto;
use tokio::sync::{mpsc, oneshot};

use self::actor::{Appended, Command, Opened};
pub use self::error::SessionError;
pub use self::notify::{Notifier, Progress};
pub use self::setup::{Environment, Services, SessionSetup};
use self::usage::UsageSnapshot;
use crate::settings;
use crate::store::Store;
/// An open session as the registry knows it.
#[derive(Debug, Clone)]
struct Handle {
    tx: mpsc::UnboundedSender<Command>,
    cwd: String,
    model: String,
    agent_window: Option<u64>,
}

/// The registry of open sessions.
#[derive(Debug)]
pub struct Sessions {
    store: Arc<Store>,
    environment: Environment,
    /// The latest `workspace/didChangeConfiguration` settings; observed transcripts
    /// follow them as they change.
    changed: tokio::sync::watch::Sender<ctxd_proto::Settings>,
    notifier: Notifier,
    open: Mutex<HashMap<String, Handle>>,
    /// Transcripts of other programs followed (`ctx/observe`), one follower each.
    followers: observe::Followers,
}

impl Sessions {
    pub fn new(store: Arc<Store>, environment: Environment, notifier: Notifier) -> Sessions {
        let (changed, _) = tokio::sync::watch::channel(ctxd_proto::Settings::default());
        let followers = observe::Followers::default();
        Sessions { store, environment, changed, notifier, open: Mutex::new(HashMap::new()), followers }
    }

    /// Where notifications go: clients attach and detach as they connect and leave.
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The gateway's live figures, which observed Claude Code transcripts follow.
    pub fn live_figures(&self) -> crate::gateway::LiveFigures {
        self.environment.services.live.clone()
    }

    fn open_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        // A panic while holding this lock cannot leave the map half-updated (every
        // update is one insert or remove), so a poisoned lock is still good.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session (resuming it when its transcript exists) and queues the `Open`
    /// command. An already open session answers from its live state.
    pub fn open(
        &self,
        params: &proto::OpenSessionParams,
    ) -> Result<(String, oneshot::Receiver<Result<Opened, SessionError>>), SessionError> {
        let id = match &params.session_id {
            Some(id) => id.clone(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        crate::store::validate_session_id(&id)?;
        let (reply, rx) = oneshot::channel();
        let mut open = self.open_map();
        let live = open.get(&id).filter(|h| !h.tx.is_closed()).map(|h| h.tx.clone());
        if params.import.is_some() && (live.is_some() || self.store.transcript_path(&id).is_ok_and(|p| p.exists())) {
            return Err(SessionError::InvalidParams(format!(
                "session {id:?} exists; an import needs a new session id"
            )));
        }
        let command = Command::Open { reply };
        match live {
            Some(tx) => tx.send(command).map_err(|_| SessionError::Closed(id.clone()))?,
            None => {
                let agent_window = params.agent.as_ref().and_then(|a| a.auto_compact_window);
                let mut setup = self.setup(&params.cwd, &params.model, agent_window);
                setup.import = params.import.as_ref().map(std::path::PathBuf::from);
                let tx =
                    actor::spawn(id.clone(), setup, self.store.clone(), self.notifier.clone(), true, Some(command));
                let handle = Handle { tx, cwd: params.cwd.clone(), model: params.model.clone(), agent_window };
                open.insert(id.clone(), handle);
            }
        }
        Ok((id, rx))
    }

    /// Drops a session whose open failed, so the next open starts afresh.
    pub fn forget(&self, id: &str) {
        let mut open = self.open_map();
        if open.get(id).is_some_and(|h| h.tx.is_closed()) {
            open.remove(id);
        }
    }

    /// Stacks the settings for `cwd` and resolves the window and levels for `model`.
    fn setup(&self, cwd: &str, model: &str, agent_window: Option<u64>) -> SessionSetup {
        let changed = self.changed.borrow().clone();
        let layered = settings::resolve(
            &self.environment.sources,
            std::path::Path::new(cwd),
            &self.environment.client_settings,
            &changed,
        );
        let (resolved, levels) = self.levels(&layered.settings, model, agent_window);
        let mut problems = layered.problems;
        problems.extend(resolved.warnings.iter().cloned());
        for problem in &problems {
            tracing::warn!(%problem, cwd, "settings");
        }
        let memory = memory_config(&self.environment, &layered.settings, cwd, &mut problems);
        SessionSetup {
            cwd: cwd.to_owned(),
            model: model.to_owned(),
            agent_window,
            settings: layered.settings.clone(),
            thresholds: levels,
            problems,
            import: None,
            memory,
            idle_after: layered.settings.idle_compaction.unwrap_or(true).then(|| {
                std::time::Duration::from_secs(layered.settings.idle_compact_after_seconds.unwrap_or(240).max(1))
            }),
            idle_floor: self.environment.process.budget().idle_compact_floor(),
            services: self.environment.services.clone(),
            process: self.environment.process.clone(),
        }
    }

    fn levels(
        &self,
        settings: &ctxd_proto::Settings,
        model: &str,
        agent_window: Option<u64>,
    ) -> (ResolvedWindow, Thresholds) {
        let env = self.environment.process.budget();
        let inputs = WindowInputs {
            setting: settings.window_for(model),
            client: self.environment.client_window,
            subagent_ceiling: agent_window,
            ..WindowInputs::default()
        };
        let resolved = resolve_window(model, &inputs, env);
        log_unknown_model_once(&resolved);
        let levels = thresholds(&resolved, env, settings.auto_compact_enabled.unwrap_or(true));
        (resolved, levels)
    }

    /// New `workspace/didChangeConfiguration` settings: every open session recomputes its
    /// levels (and pushes its usage if they moved).
    pub fn settings_changed(&self, changed: ctxd_proto::Settings) {
        self.changed.send_replace(changed);
        self.reconfigure(|_| true);
    }

    fn reconfigure(&self, which: impl Fn(&str) -> bool) {
        let handles: Vec<Handle> = self.open_map().values().filter(|h| which(&h.model)).cloned().collect();
        for handle in handles {
            let setup = self.setup(&handle.cwd, &handle.model, handle.agent_window);
            let _ = handle.tx.send(Command::Reconfigure { setup });
        }
    }

    /// `ctx/setAutoCompactWindow`: saves (or clears) the window of a model and applies it
    /// to the open sessions of that model. Returns the window now in force for the model
    /// outside any project.
    pub fn set_auto_compact_window(
        &self,
        model: &str,
        window: Option<u64>,
    ) -> Result<(ResolvedWindow, WindowSource), SessionError> {
        settings::save_window(&self.environment.sources, model, window)
            .map_err(|e| SessionError::Store(format!("{}: {e}", self.environment.sources.saved_file.display())))?;
        self.reconfigure(|m| m == model);
        // Observed transcripts take the saved window from the settings files again.
        self.changed.send_modify(|_| {});
        let changed = self.changed.borrow().clone();
        let home = self.environment.sources.home.clone().unwrap_or_else(|| std::path::PathBuf::from("/"));
        let layered = settings::resolve(&self.environment.sources, &home, &self.environment.client_settings, &changed);
        let (resolved, _) = self.levels(&layered.settings, model, None);
        let source = resolved.source;
        Ok((resolved, source))
    }

    /// `ctx/observe`: follows a transcript written by another program, with the settings
    /// in force as they change; a transcript followed already answers from its follower.
    pub async fn observe(&self, path: std::path::PathBuf) -> Result<(String, UsageSnapshot), SessionError> {
        let environment = self.environment.clone();
        let policy_of = move |changed: &ctxd_proto::Settings| {
            let home = environment.sources.home.clone().unwrap_or_else(|| std::path::PathBuf::from("/"));
            let settings =
                settings::resolve(&environment.sources, &home, &environment.client_settings, changed).settings;
            let idle = observe::IdlePolicy::from_settings(&settings);
            let environment = environment.clone();
            let thresholds_for = move |model: &str| {
                let inputs = WindowInputs {
                    setting: settings.window_for(model),
                    client: environment.client_window,
                    ..WindowInputs::default()
                };
                let resolved = resolve_window(model, &inputs, environment.process.budget());
                log_unknown_model_once(&resolved);
                let levels =
                    thresholds(&resolved, environment.process.budget(), settings.auto_compact_enabled.unwrap_or(true));
                // An observed session is compacted by the program that writes it: where
                // that program makes no auto-compact decision for the model, there is
                // none to show.
                Thresholds { auto_compact_enabled: levels.shows_compact_figure, ..levels }
            };
            observe::Policy { idle, thresholds: Box::new(thresholds_for) }
        };
        let memory_for: observe::MemoryFor = {
            let (environment, changed) = (self.environment.clone(), self.changed.subscribe());
            Arc::new(move |cwd: &std::path::Path| {
                let settings =
                    settings::resolve(&environment.sources, cwd, &environment.client_settings, &changed.borrow())
                        .settings;
                memory_config(&environment, &settings, &cwd.display().to_string(), &mut Vec::new())
            })
        };
        let deps = observe::Deps {
            policy_of: Box::new(policy_of),
            settings: self.changed.subscribe(),
            env: self.environment.process.clone(),
            settings_for: self.claude_settings_for(),
            services: self.environment.services.clone(),
            memory_for,
            notifier: self.notifier.clone(),
        };
        let start = |names, idle_gate| observe::start(path.clone(), names, idle_gate, deps);
        self.followers.follow(&path, start).await.map_err(SessionError::InvalidParams)
    }

    /// `ctx/observe` with a project directory: its newest transcript now, and every
    /// transcript in it that appears or changes later (followed in the background).
    pub async fn observe_project(
        self: &Arc<Self>,
        dir: std::path::PathBuf,
    ) -> Result<(String, UsageSnapshot), SessionError> {
        let transcripts = self.follow_folder(dir.clone()).await;
        let Some(newest) = transcripts.first().cloned() else {
            return Err(SessionError::InvalidParams(format!("no transcript (*.jsonl) in {} yet", dir.display())));
        };
        self.observe(newest).await
    }

    /// `observeClaudeProjects`: every project under `root` (`~/.claude/projects`), now
    /// and as they appear; in each, the newest transcript now and every transcript that
    /// appears or changes.
    pub fn follow_claude_projects(self: &Arc<Self>, root: std::path::PathBuf) {
        let sessions = self.clone();
        let mut subscription =
            self.environment.services.watcher.subscribe([crate::context::watcher::Target::dir(root.clone())]);
        tokio::spawn(async move {
            let mut followed = HashSet::new();
            loop {
                let listed = root.clone();
                let projects =
                    tokio::task::spawn_blocking(move || observe::folders_in(&listed)).await.unwrap_or_default();
                for project in projects {
                    if !followed.insert(project.clone()) {
                        continue;
                    }
                    let transcripts = sessions.follow_folder(project).await;
                    if let Some(newest) = transcripts.first() {
                        // Clients learn of a followed session from its first usage.
                        match sessions.observe(newest.clone()).await {
                            Ok((id, usage)) => sessions.notifier.usage_changed(&id, usage).await,
                            Err(e) => tracing::warn!(path = %newest.display(), error = %e, "cannot observe"),
                        }
                    }
                }
                if subscription.recv().await.is_none() {
                    break;
                }
            }
        });
    }

    /// The settings that apply outside any project (user files and the client's).
    pub fn daemon_settings(&self) -> ctxd_proto::Settings {
        let changed = self.changed.borrow().clone();
        let home = self.environment.sources.home.clone().unwrap_or_else(|| std::path::PathBuf::from("/"));
        settings::resolve(&self.environment.sources, &home, &self.environment.client_settings, &changed).settings
    }

    /// The settings for a Claude Code session compacted in place: the layers that apply
    /// to its project directory (home when it names none), the client's and the latest
    /// `workspace/didChangeConfiguration` as they are when it is called.
    pub fn claude_settings_for(&self) -> crate::claude::SettingsFor {
        let sources = self.environment.sources.clone();
        let client = self.environment.client_settings.clone();
        let changed = self.changed.subscribe();
        std::sync::Arc::new(move |project: Option<&std::path::Path>| {
            let home = sources.home.clone().unwrap_or_else(|| std::path::PathBuf::from("/"));
            settings::resolve(&sources, project.unwrap_or(&home), &client, &changed.borrow()).settings
        })
    }

    /// Where Claude Code keeps its transcripts (`$CLAUDE_CONFIG_DIR/projects`, else
    /// `~/.claude/projects`), as the `claude` commands find them.
    pub fn claude_projects_dir(&self) -> Option<std::path::PathBuf> {
        self.environment.process.claude_projects_dir()
    }

    /// True when `id` is neither open nor in the store (or not a valid id).
    pub fn is_unknown(&self, id: &str) -> bool {
        if crate::store::validate_session_id(id).is_err() {
            return true;
        }
        if self.open_map().get(id).is_some_and(|h| !h.tx.is_closed()) {
            return false;
        }
        self.store.index().get(id).is_none() || !self.store.transcript_path(id).is_ok_and(|p| p.exists())
    }

    /// The actor of an open session. A session that is in the store but not open (the
    /// daemon restarted under a client) is resumed with the working directory and model
    /// the index remembers, so clients need not reopen every session after a restart.
    fn sender(&self, id: &str) -> Result<mpsc::UnboundedSender<Command>, SessionError> {
        crate::store::validate_session_id(id)?;
        let mut open = self.open_map();
        if let Some(handle) = open.get(id).filter(|h| !h.tx.is_closed()) {
            return Ok(handle.tx.clone());
        }
        let known = self.store.index().get(id).filter(|_| self.store.transcript_path(id).is_ok_and(|p| p.exists()));
        let Some(entry) = known else {
            return Err(SessionError::NotOpen(id.to_owned()));
        };
        tracing::info!(session = id, "resuming a session that was not open");
        let setup = self.setup(&entry.cwd, &entry.model, entry.agent_window);
        let tx = actor::spawn(id.to_owned(), setup, self.store.clone(), self.notifier.clone(), false, None);
        open.insert(
            id.to_owned(),
            Handle { tx: tx.clone(), cwd: entry.cwd, model: entry.model, agent_window: entry.agent_window },
        );
        Ok(tx)
    }

    pub fn append(
        &self,
        id: &str,
        records: Vec<Record>,
    ) -> Result<oneshot::Receiver<Result<Appended, SessionError>>, SessionError> {
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Append { records, reply }).map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    pub fn file_read(
        &self,
        id: &str,
        path: String,
        start_line: Option<u64>,
        num_lines: Option<u64>,
    ) -> Result<oneshot::Receiver<Result<actor::FileReadAnswer, SessionError>>, SessionError> {
        if !std::path::Path::new(&path).is_absolute() {
            return Err(SessionError::InvalidParams(format!("path must be absolute: {path:?}")));
        }
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::FileRead { path, start_line, num_lines, reply })
            .map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    pub fn compact(
        &self,
        id: &str,
        trigger: ctxd_core::compact::Trigger,
        instructions: Option<String>,
        progress: Option<Progress>,
        partial: Option<(ctxd_core::compact::SplitDirection, String)>,
    ) -> Result<oneshot::Receiver<Result<actor::CompactAnswer, SessionError>>, SessionError> {
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Compact { trigger, instructions, partial, progress, reply })
            .map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    /// `ctx/undoCompact`: takes back the latest compaction if no new turn followed it.
    pub fn undo_compact(
        &self,
        id: &str,
    ) -> Result<oneshot::Receiver<Result<actor::UndoAnswer, SessionError>>, SessionError> {
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::UndoCompact { reply }).map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    /// The client cancelled (or dropped) a compaction request: stop it if it still runs.
    pub fn cancel_compaction(&self, id: &str) {
        if let Some(handle) = self.open_map().get(id) {
            let _ = handle.tx.send(Command::CancelCompaction);
        }
    }

    /// `ctx/clear`: closes the session and opens a new, empty one in the same directory
    /// with the same model.
    pub fn clear(&self, id: &str) -> Result<(String, oneshot::Receiver<Result<Opened, SessionError>>), SessionError> {
        crate::store::validate_session_id(id)?;
        let (cwd, model, agent_window) = {
            let open = self.open_map();
            match open.get(id) {
                Some(h) => (h.cwd.clone(), h.model.clone(), h.agent_window),
                None => {
                    let entry = self.store.index().get(id).ok_or_else(|| SessionError::NotOpen(id.to_owned()))?;
                    (entry.cwd, entry.model, entry.agent_window)
                }
            }
        };
        let _ = self.close(id);
        let agent = agent_window.map(|w| proto::AgentSettings { name: None, auto_compact_window: Some(w) });
        self.open(&proto::OpenSessionParams { cwd, model, session_id: None, import: None, agent })
    }

    pub fn reduce(
        &self,
        id: &str,
        reduction: actor::Reduction,
    ) -> Result<oneshot::Receiver<Result<actor::Reduced, SessionError>>, SessionError> {
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Reduce { reduction, reply }).map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    pub fn assemble(
        &self,
        id: &str,
        request: actor::AssembleRequest,
    ) -> Result<oneshot::Receiver<Result<actor::AssembleAnswer, SessionError>>, SessionError> {
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Assemble { request, reply }).map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    pub fn context(&self, id: &str) -> Result<oneshot::Receiver<actor::ContextView>, SessionError> {
        if let Some(answer) = self.followers.context(id) {
            return Ok(answer);
        }
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Context { reply }).map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    pub fn usage(&self, id: &str) -> Result<oneshot::Receiver<UsageSnapshot>, SessionError> {
        if let Some(usage) = self.followers.usage(id) {
            let (reply, rx) = oneshot::channel();
            let _ = reply.send(usage);
            return Ok(rx);
        }
        let tx = self.sender(id)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Usage { reply }).map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    /// Closes a session: its actor finishes what was queued before the close, then
    /// stops. The registry keeps the stopped handle, so a later command for the session
    /// resumes it from disk only once the old actor has let go of the file.
    pub fn close(&self, id: &str) -> Result<oneshot::Receiver<()>, SessionError> {
        crate::store::validate_session_id(id)?;
        let tx = self
            .open_map()
            .get(id)
            .filter(|h| !h.tx.is_closed())
            .map(|h| h.tx.clone())
            .ok_or_else(|| SessionError::NotOpen(id.to_owned()))?;
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Close { reply }).map_err(|_| SessionError::Closed(id.to_owned()))?;
        Ok(rx)
    }

    /// Closes every session and waits until each has finished its queue.
    pub async fn close_all(&self) {
        let ids: Vec<String> = self.open_map().keys().cloned().collect();
        let waits: Vec<_> = ids.iter().filter_map(|id| self.close(id).ok()).collect();
        for wait in waits {
            let _ = wait.await;
        }
        self.store.index().flush();
    }
}

/// Where memory files are looked for by a session in `cwd` under `settings`; what the
/// settings name that cannot be used is added to `problems`.
fn memory_config(
    environment: &Environment,
    settings: &ctxd_proto::Settings,
    cwd: &str,
    problems: &mut Vec<String>,
) -> ctxd_core::memory::MemoryConfig {
    let home = environment.sources.home.clone().unwrap_or_else(|| std::path::PathBuf::from("/"));
    let mut memory = ctxd_core::memory::MemoryConfig::new(home);
    memory.managed_path = Some(environment.process.managed_memory_path());
    if let Some(names) = &settings.memory_file_names {
        // Names, not paths: `../../etc/passwd` would load a file from anywhere.
        let (plain, paths): (Vec<_>, Vec<_>) = names
            .iter()
            .cloned()
            .partition(|name| !name.is_empty() && name != "." && name != ".." && !name.contains('/'));
        for name in paths {
            let problem = format!("memoryFileNames: {name:?} ignored: a memory file name is a plain file name");
            tracing::warn!(%problem, cwd, "settings");
            problems.push(problem);
        }
        memory.file_names = plain;
    }
    for folder in settings.import_folders.iter().flatten() {
        match folder.strip_prefix("~") {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                memory.import_roots.push(memory.home.join(rest.trim_start_matches('/')))
            }
            _ if folder.starts_with('/') => memory.import_roots.push(std::path::PathBuf::from(folder)),
            _ => problems.push(format!("importFolders: {folder:?} ignored: an absolute path or one starting with ~/")),
        }
    }
    memory
}

/// Says where an unknown model's window came from, once per model for the process
/// (every session of the model, and every reconfiguration, would repeat it).
fn log_unknown_model_once(resolved: &ResolvedWindow) {
    static SEEN: std::sync::OnceLock<Mutex<std::collections::HashSet<String>>> = std::sync::OnceLock::new();
    let Some(note) = &resolved.unknown_model else {
        return;
    };
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner);
    if seen.insert(note.clone()) {
        tracing::info!("{note}");
    }
}
