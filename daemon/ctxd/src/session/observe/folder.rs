//! Following a Claude Code project folder as a whole (`ctx/observe` with `projectDir`,
//! and every project under `~/.claude/projects` with `observeClaudeProjects`).
//!
//! The program keeps one transcript per session in the folder and appends to an older
//! one when a session is resumed (`claude --resume`), so following only the newest at
//! start misses the session the user is working in. The folder's task watches the
//! folder (for transcripts that appear) and each transcript in it (for writes: one OS
//! watch on the folder serves them all) and starts a follower for each transcript that
//! appears or changes and has none; clients learn of it from the figure pushed then,
//! under its own `observe-` id. Transcripts that do not change cost a path each and no
//! reading.
//!
//! The folder is subscribed to before it is listed, so a transcript made in between is
//! in the listing or in a delivery. Each folder has one task however often it is asked
//! for (by its path as given, which is also what the ids of its transcripts hash).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError};

use super::{observe_id, transcripts_in};
use crate::context::watcher::{Subscription, Target};
use crate::session::Sessions;

impl Sessions {
    /// Follows every transcript in `dir` that appears or changes from now on, once per
    /// folder; returns the transcripts in it now, newest first.
    pub(crate) async fn follow_folder(self: &Arc<Self>, dir: PathBuf) -> Vec<PathBuf> {
        let first = self.followers.folders.lock().unwrap_or_else(PoisonError::into_inner).insert(dir.clone());
        let subscription = first.then(|| self.environment.services.watcher.subscribe([Target::dir(dir.clone())]));
        let listed = listing(dir.clone()).await;
        if let Some(subscription) = subscription {
            subscription.add(listed.iter().cloned().map(Target::file));
            let known = listed.iter().cloned().collect();
            tokio::spawn(self.clone().watch_folder(dir, subscription, known));
        }
        listed
    }

    /// The folder's task: a follower for each transcript that appears in `dir` or
    /// changes and has none. `known` are the transcripts watched already.
    async fn watch_folder(self: Arc<Self>, dir: PathBuf, mut subscription: Subscription, mut known: HashSet<PathBuf>) {
        while let Some(changed) = subscription.recv().await {
            let mut touched: Vec<(PathBuf, &str)> = Vec::new();
            if changed.contains(&dir) {
                let new: Vec<PathBuf> = listing(dir.clone()).await.into_iter().filter(|p| !known.contains(p)).collect();
                subscription.add(new.iter().cloned().map(Target::file));
                known.extend(new.iter().cloned());
                touched.extend(new.into_iter().map(|p| (p, "a new transcript")));
            }
            touched.extend(changed.into_iter().filter(|p| known.contains(p)).map(|p| (p, "a transcript that changed")));
            for (path, what) in touched {
                if self.followers.running(&observe_id(&path)) {
                    continue;
                }
                // Clients learn of a followed session from its first figure.
                match self.observe(path.clone()).await {
                    Ok((id, usage)) => {
                        tracing::info!(path = %path.display(), id, "observing {what}");
                        self.notifier.usage_changed(&id, usage).await;
                    }
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot observe"),
                }
            }
        }
    }
}

/// The transcripts in `dir`, newest first, listed on the blocking pool.
async fn listing(dir: PathBuf) -> Vec<PathBuf> {
    tokio::task::spawn_blocking(move || transcripts_in(&dir)).await.unwrap_or_default()
}
