//! The watcher's bookkeeping, behind one lock: who wants which path and how
//! ([`State::interests`]), each subscriber's pending changes, and which directories must be
//! watched for those paths to be heard ([`State::needs`], reference-counted). Adding and
//! removing targets here is what arms and disarms the OS watches (in `os_watches`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ctxd_core::memory::WatchKind;
use tokio::sync::mpsc::UnboundedSender;

use super::{Backend, SubscriptionId, Target};

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) degraded: Arc<AtomicBool>,
    pub(super) next_id: AtomicU64,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves maps that are still consistent enough to serve.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) struct State {
    pub(super) backend: Option<Backend>,
    pub(super) debounce: Duration,
    pub(super) subs: HashMap<SubscriptionId, Sub>,
    /// Every path some subscriber wants, and who wants it how. Sorted so the paths below
    /// a changed directory are one range.
    pub(super) interests: BTreeMap<PathBuf, Wanters>,
    /// Directories whose events reveal changes to interests: a file's parent, a listed
    /// folder and its parent. Each rests on the watch of its nearest existing ancestor.
    pub(super) needs: BTreeMap<PathBuf, Need>,
    /// Directories watched with the OS, with how many needs rest on each.
    pub(super) armed: HashMap<PathBuf, usize>,
    /// Watched directories that were removed, renamed or replaced: their OS watch may be
    /// dead or follow a folder that is now elsewhere.
    pub(super) stale: BTreeSet<PathBuf>,
    pub(super) degraded: Arc<AtomicBool>,
    pub(super) warned_limit: bool,
    pub(super) warned_dirs: HashSet<PathBuf>,
}

/// Who wants one path watched, and how. Nearly always one subscriber, kept inline: a
/// session can watch thousands of read files, and a map per path would cost more than
/// the path.
pub(super) enum Wanters {
    One(SubscriptionId, WatchKind),
    Many(Vec<(SubscriptionId, WatchKind)>),
}

impl Default for Wanters {
    fn default() -> Self {
        Wanters::Many(Vec::new())
    }
}

impl Wanters {
    pub(super) fn insert(&mut self, id: SubscriptionId, kind: WatchKind) {
        match self {
            Wanters::One(only, k) if *only == id => *k = kind,
            Wanters::One(only, k) => *self = Wanters::Many(vec![(*only, *k), (id, kind)]),
            Wanters::Many(list) if list.is_empty() => *self = Wanters::One(id, kind),
            Wanters::Many(list) => match list.iter_mut().find(|(i, _)| *i == id) {
                Some(slot) => slot.1 = kind,
                None => list.push((id, kind)),
            },
        }
    }

    pub(super) fn remove(&mut self, id: &SubscriptionId) {
        match self {
            Wanters::One(only, _) if only == id => *self = Wanters::Many(Vec::new()),
            Wanters::One(..) => {}
            Wanters::Many(list) => list.retain(|(i, _)| i != id),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Wanters::Many(list) if list.is_empty())
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&SubscriptionId, &WatchKind)> {
        let (one, many) = match self {
            Wanters::One(id, kind) => (Some((id, kind)), &[][..]),
            Wanters::Many(list) => (None, list.as_slice()),
        };
        one.into_iter().chain(many.iter().map(|(id, kind)| (id, kind)))
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &SubscriptionId> {
        self.iter().map(|(id, _)| id)
    }
}

pub(super) struct Need {
    pub(super) refs: usize,
    /// The directory whose OS watch covers this need; `None` when none could be armed.
    pub(super) armed_at: Option<PathBuf>,
}

pub(super) struct Sub {
    pub(super) targets: BTreeMap<PathBuf, WatchKind>,
    pub(super) tx: UnboundedSender<Vec<PathBuf>>,
    pub(super) pending: BTreeSet<PathBuf>,
    pub(super) first_pending: Option<Instant>,
    pub(super) due: Option<Instant>,
}

impl Sub {
    pub(super) fn new(tx: UnboundedSender<Vec<PathBuf>>) -> Self {
        Self { targets: BTreeMap::new(), tx, pending: BTreeSet::new(), first_pending: None, due: None }
    }
}

/// The directories whose events tell about `target`.
fn needs_of(path: &Path, kind: WatchKind) -> Vec<PathBuf> {
    let parent = path.parent().map(Path::to_path_buf);
    match kind {
        WatchKind::File => parent.into_iter().collect(),
        WatchKind::Dir => std::iter::once(path.to_path_buf()).chain(parent).collect(),
    }
}

pub(super) fn collect_targets<T: Into<Target>>(targets: impl IntoIterator<Item = T>) -> BTreeMap<PathBuf, WatchKind> {
    let mut out = BTreeMap::new();
    for target in targets {
        let Target { path, kind } = target.into();
        if !path.is_absolute() || path.parent().is_none() {
            tracing::debug!(path = %path.display(), "not watched: not an absolute path below a folder");
            continue;
        }
        // A folder also asked for as a file is reported for both reasons.
        let slot = out.entry(path).or_insert(kind);
        if kind == WatchKind::Dir {
            *slot = WatchKind::Dir;
        }
    }
    out
}

impl State {
    pub(super) fn new(backend: Option<Backend>, debounce: Duration, degraded: Arc<AtomicBool>) -> Self {
        Self {
            backend,
            debounce,
            subs: HashMap::new(),
            interests: BTreeMap::new(),
            needs: BTreeMap::new(),
            armed: HashMap::new(),
            stale: BTreeSet::new(),
            degraded,
            warned_limit: false,
            warned_dirs: HashSet::new(),
        }
    }

    pub(super) fn set_targets(&mut self, id: SubscriptionId, new: BTreeMap<PathBuf, WatchKind>) {
        let Some(sub) = self.subs.get_mut(&id) else {
            tracing::debug!(?id, "update of an unknown subscription ignored");
            return;
        };
        let old = std::mem::replace(&mut sub.targets, new.clone());
        sub.pending.retain(|path| new.contains_key(path));
        if sub.pending.is_empty() {
            sub.first_pending = None;
            sub.due = None;
        }

        for path in old.keys() {
            if let Some(subs) = self.interests.get_mut(path) {
                subs.remove(&id);
                if subs.is_empty() {
                    self.interests.remove(path);
                }
            }
        }
        for (path, kind) in &new {
            self.interests.entry(path.clone()).or_default().insert(id, *kind);
        }
        // New needs first, so a directory needed before and after keeps its watch.
        for (path, kind) in &new {
            for need in needs_of(path, *kind) {
                self.add_need(need);
            }
        }
        for (path, kind) in &old {
            for need in needs_of(path, *kind) {
                self.remove_need(&need);
            }
        }
    }

    pub(super) fn add_targets(&mut self, id: SubscriptionId, extra: BTreeMap<PathBuf, WatchKind>) {
        let Some(sub) = self.subs.get_mut(&id) else {
            tracing::debug!(?id, "addition to an unknown subscription ignored");
            return;
        };
        // (path, how it was wanted before, how it is wanted now)
        let mut changed = Vec::new();
        for (path, kind) in extra {
            let old = sub.targets.get(&path).copied();
            if old == Some(WatchKind::Dir) || old == Some(kind) {
                continue;
            }
            sub.targets.insert(path.clone(), kind);
            changed.push((path, old, kind));
        }
        for (path, old, kind) in changed {
            self.interests.entry(path.clone()).or_default().insert(id, kind);
            for need in needs_of(&path, kind) {
                self.add_need(need);
            }
            for need in old.map(|old| needs_of(&path, old)).unwrap_or_default() {
                self.remove_need(&need);
            }
        }
    }

    pub(super) fn remove_sub(&mut self, id: SubscriptionId) {
        if self.subs.contains_key(&id) {
            self.set_targets(id, BTreeMap::new());
            self.subs.remove(&id);
        }
    }

    pub(super) fn add_need(&mut self, need: PathBuf) {
        if let Some(entry) = self.needs.get_mut(&need) {
            entry.refs += 1;
            return;
        }
        let armed_at = self.arm_nearest(&need);
        self.needs.insert(need, Need { refs: 1, armed_at });
    }

    pub(super) fn remove_need(&mut self, need: &Path) {
        let Some(entry) = self.needs.get_mut(need) else {
            return;
        };
        entry.refs -= 1;
        if entry.refs > 0 {
            return;
        }
        let armed_at = entry.armed_at.take();
        self.needs.remove(need);
        if let Some(dir) = armed_at {
            self.disarm(&dir);
        }
    }
}
