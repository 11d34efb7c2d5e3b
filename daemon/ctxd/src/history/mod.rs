//! The history index: full-text search over every transcript ctxd keeps or Claude Code
//! writes, so what a compaction took out of a model's view can be found and read back
//! (`ctxd mcp` for agents, `ctx/searchHistory` and `ctx/readHistory` for hosts).
//!
//! ```text
//! <state dir>/history/     tantivy: one document per record with text
//!   meta.json payload      per transcript: identity, offset indexed to, tail hash,
//!                          compact boundaries, working directory
//! ```
//!
//! **The index is a cache.** Transcripts are the truth: a search first brings the index
//! up to date for the transcripts it covers (reading only what was appended since the
//! offset indexed to; a transcript that was replaced, cut or rewritten under that offset
//! is indexed again from its start), and every hit is read back from its transcript
//! (its text for the snippet, its uuid checked) before it is shown; a hit the file no
//! longer confirms is dropped and its transcript indexed again. An index that cannot be
//! opened or read is moved aside as `history.damaged` and rebuilt; a schema or format
//! change does the same. The documents and the offsets they reach are written in one
//! commit (the offsets are the commit's payload), so a crash leaves both as they were.
//!
//! Several processes share it (the daemon, one `ctxd mcp` per Claude Code session): each
//! takes tantivy's writer lock only to bring the index up to date and lets it go after
//! the commit; a process that finds it held waits a little, then searches what is
//! committed and says so.
//!
//! What is read: only transcripts under the roots (`sources`), through the bounded
//! reader (regular files only, lines over [`LINE_CAP`] skipped and counted), never a
//! path from the index or a query. What comes back is bounded: at most [`MAX_LIMIT`]
//! hits of [`SNIPPET_CHARS`] characters, and at most [`MAX_READ_CHARS`] of text from a
//! read.

mod lines;
mod read;
pub mod sources;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use ctxd_core::recall::{self, Boundaries, Candidate, Role, What};
use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::{BooleanQuery, Occur, PhraseQuery, Query, QueryParser, RangeQuery, TermQuery, TermSetQuery};
use tantivy::schema::{FAST, Field, INDEXED, IndexRecordOption, STORED, STRING, Schema, TEXT, Value as _};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

pub use self::read::{Read, ReadRecord};
pub use self::sources::{Origin, Roots, Source};

/// Longest transcript line read; a longer one is skipped (and counted).
pub const LINE_CAP: usize = 16 << 20;
/// Text indexed per record; the rest is still in the transcript, for a read.
pub const MAX_INDEXED_TEXT: usize = 1 << 20;
/// Characters of a hit's snippet.
pub const SNIPPET_CHARS: usize = 300;
pub const DEFAULT_LIMIT: usize = 10;
pub const MAX_LIMIT: usize = 50;
/// Longest query, in bytes.
pub const MAX_QUERY: usize = 4096;
pub const DEFAULT_READ_CHARS: usize = 20_000;
pub const MAX_READ_CHARS: usize = 200_000;
pub const DEFAULT_NEIGHBOURS: usize = 2;
pub const MAX_NEIGHBOURS: usize = 50;

/// Written in the payload: a different value means another layout, rebuilt.
const FORMAT: u32 = 1;
/// The indexing arena, one thread: flushed into a segment when full.
const WRITER_BUDGET: usize = 64 << 20;
/// How long a search waits for another process's update before it searches what is
/// committed.
const WRITER_WAIT: Duration = Duration::from_secs(2);

/// Why a history request failed.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A session or record that is not there.
    #[error("{0}")]
    NotFound(String),
    /// A request that cannot be answered as asked.
    #[error("{0}")]
    Invalid(String),
    #[error("history index {}: {message}", path.display())]
    Index { path: PathBuf, message: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// The index's fields.
#[derive(Debug, Clone, Copy)]
struct Fields {
    /// The transcript's key (`Source::key`), for scope and re-indexing.
    source: Field,
    uuid: Field,
    /// Byte offset of the record's line: where a reader finds it, and what "before
    /// the latest compaction" compares.
    offset: Field,
    timestamp: Field,
    role: Field,
    text: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let fields = Fields {
        source: b.add_text_field("source", STRING | STORED),
        uuid: b.add_text_field("uuid", STORED),
        offset: b.add_u64_field("offset", INDEXED | FAST | STORED),
        timestamp: b.add_text_field("timestamp", STORED),
        role: b.add_text_field("role", STRING | STORED),
        // Positions kept: a quoted phrase is searched as a phrase.
        text: b.add_text_field("text", TEXT),
    };
    (b.build(), fields)
}

/// What the index knows of the transcripts, committed with the documents.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    format: u32,
    sources: BTreeMap<String, SourceState>,
}

/// One transcript as last indexed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct SourceState {
    dev: u64,
    ino: u64,
    /// Length and modification time when last looked at: unchanged, nothing to read.
    len: u64,
    mtime_ns: u64,
    /// Offset past the last complete line indexed.
    indexed_to: u64,
    /// Hash of the bytes just before `indexed_to`: a file rewritten under the offset
    /// no longer matches it.
    tail: u64,
    boundaries: Boundaries,
    /// The first working directory a record names.
    cwd: Option<String>,
    records: u64,
    /// Lines over the cap, and lines that are not records.
    skipped: u64,
}

struct Inner {
    index: Index,
    reader: IndexReader,
    fields: Fields,
}

impl Inner {
    fn open(dir: &Path) -> Result<Inner, String> {
        let (schema, fields) = schema();
        let directory = MmapDirectory::open(dir).map_err(|e| e.to_string())?;
        let index = Index::open_or_create(directory, schema).map_err(|e| e.to_string())?;
        let reader =
            index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(|e| e.to_string())?;
        let inner = Inner { index, reader, fields };
        let state = inner.state()?;
        if state.format != FORMAT && !state.sources.is_empty() {
            return Err(format!("format {} where this ctxd writes {FORMAT}", state.format));
        }
        Ok(inner)
    }

    /// The committed state (`Err`: the payload is damaged).
    fn state(&self) -> Result<State, String> {
        let metas = self.index.load_metas().map_err(|e| e.to_string())?;
        match metas.payload {
            None => Ok(State { format: FORMAT, sources: BTreeMap::new() }),
            Some(text) => serde_json::from_str(&text).map_err(|e| format!("payload: {e}")),
        }
    }
}

/// The session name that means every session of the project.
pub const ALL: &str = "all";

/// The transcripts a search covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub sources: Vec<Source>,
    /// The key of the session asked about (or the project's newest).
    pub preferred: Option<String>,
}

/// A name as echoed in an error: never the whole of a long one.
fn cut_name(name: &str) -> String {
    name.chars().take(80).collect()
}

/// A search.
#[derive(Debug, Clone)]
pub struct SearchRequest<'a> {
    pub query: &'a str,
    /// The transcripts searched.
    pub sources: &'a [Source],
    /// The key of the session asked about, ranked first on a tie.
    pub preferred: Option<&'a str>,
    pub limit: usize,
    pub before_compaction_only: bool,
}

/// One hit.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub source: Source,
    pub uuid: String,
    pub timestamp: Option<String>,
    pub role: Role,
    pub snippet: String,
    pub before_compaction: bool,
}

/// A search's answer.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub hits: Vec<Hit>,
    /// What could not be done as asked, one sentence each.
    pub notes: Vec<String>,
}

/// What bringing the index up to date did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Transcripts read (appended bytes or all of them).
    pub sources: usize,
    /// Bytes read.
    pub bytes: u64,
    /// Records indexed.
    pub records: u64,
    /// Transcripts indexed again from their start.
    pub reindexed: usize,
    /// Another process held the index: the update was left to it.
    pub busy: bool,
}

/// The history index of one state directory.
pub struct History {
    dir: PathBuf,
    roots: Roots,
    inner: RwLock<Inner>,
    /// One update at a time within the process.
    updating: Mutex<()>,
    /// Transcripts a hit found out of step with the index: indexed again next time.
    distrusted: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").field("dir", &self.dir).field("roots", &self.roots).finish_non_exhaustive()
    }
}

impl History {
    /// Opens (creating) the index under `state_dir`; a damaged one is moved aside and
    /// started again.
    pub fn open(state_dir: &Path, roots: Roots) -> Result<History, HistoryError> {
        crate::store::create_private_dir(state_dir).map_err(|e| index_error(state_dir, e))?;
        let dir = state_dir.join("history");
        let inner = open_or_rebuild(&dir)?;
        Ok(History {
            dir,
            roots,
            inner: RwLock::new(inner),
            updating: Mutex::new(()),
            distrusted: Mutex::new(HashSet::new()),
        })
    }

    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    /// The index's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The transcripts of a Claude Code project folder and the store's sessions whose
    /// records name a working directory in it.
    pub fn project_sources(&self, folder: &str) -> Result<Vec<Source>, HistoryError> {
        let mut sources = self.roots.claude_project(folder);
        let store = self.roots.store_sources();
        self.refresh(&store)?;
        let state = self.read_inner(|inner| inner.state())?;
        sources.extend(store.into_iter().filter(|s| {
            let cwd = state.sources.get(&s.key).and_then(|st| st.cwd.as_deref());
            cwd.is_some_and(|cwd| sources::project_folder(Path::new(cwd)) == folder)
        }));
        Ok(sources
            .into_iter()
            .map(|mut s| {
                s.project = Some(folder.to_owned());
                s
            })
            .collect())
    }

    /// A session by name: a Claude Code session id, a store session id or an
    /// `observe-…` id, looked for in the order `first` says.
    pub fn session(&self, name: &str, first: Origin) -> Result<Source, HistoryError> {
        let claude = || self.roots.claude_session(name);
        let store = || self.roots.store_source(name);
        let found = match first {
            Origin::Claude => claude().or_else(store),
            Origin::Store => store().or_else(claude),
        };
        found.or_else(|| name.starts_with("observe-").then(|| self.roots.observed(name)).flatten()).ok_or_else(|| {
            HistoryError::NotFound(format!("no session {:?} in the store or Claude Code's projects", cut_name(name)))
        })
    }

    /// What a search covers: the session named (`"all"` or none: every session of
    /// `project`, the newest Claude Code session first among equals).
    pub fn scope(&self, session: Option<&str>, project: Option<&Path>, first: Origin) -> Result<Scope, HistoryError> {
        match (session.filter(|s| *s != ALL), project) {
            (Some(name), _) => {
                let source = self.session(name, first)?;
                Ok(Scope { preferred: Some(source.key.clone()), sources: vec![source] })
            }
            (None, Some(dir)) => {
                let folder = sources::project_folder(dir);
                let sources = self.project_sources(&folder)?;
                if sources.is_empty() {
                    return Err(HistoryError::NotFound(format!("no session of the project {} yet", dir.display())));
                }
                let preferred = self.roots.claude_project(&folder).first().map(|s| s.key.clone());
                Ok(Scope { sources, preferred })
            }
            (None, None) => Err(HistoryError::Invalid("name a session, or a project directory".into())),
        }
    }

    /// The newest Claude Code session of the project in `dir` (the one a Claude Code
    /// started there is writing).
    pub fn newest_session(&self, dir: &Path) -> Result<Scope, HistoryError> {
        let newest = self.roots.claude_project(&sources::project_folder(dir)).into_iter().next().ok_or_else(|| {
            HistoryError::NotFound(format!("no Claude Code session of the project {} yet", dir.display()))
        })?;
        Ok(Scope { preferred: Some(newest.key.clone()), sources: vec![newest] })
    }

    /// Brings the index up to date for `sources`: what was appended to each since it was
    /// indexed, all of a transcript that was replaced or cut.
    pub fn refresh(&self, sources: &[Source]) -> Result<Refreshed, HistoryError> {
        let _one = self.updating.lock().unwrap_or_else(|p| p.into_inner());
        let distrusted: HashSet<String> =
            std::mem::take(&mut *self.distrusted.lock().unwrap_or_else(|p| p.into_inner()));
        let committed = self.read_inner(|inner| inner.state())?;
        let stale: Vec<&Source> = sources
            .iter()
            .filter(|s| distrusted.contains(&s.key) || changed(committed.sources.get(&s.key), &s.path))
            .collect();
        if stale.is_empty() {
            return Ok(Refreshed::default());
        }
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(mut writer) = acquire_writer(&inner.index, &self.dir)? else {
            tracing::info!(dir = %self.dir.display(), "history index: another process is updating it; searching what is committed");
            return Ok(Refreshed { busy: true, ..Refreshed::default() });
        };
        // Under the lock: what another process committed meanwhile.
        let mut state = inner.state().map_err(|m| self.damaged(m))?;
        state.format = FORMAT;
        let mut done = Refreshed::default();
        for source in stale {
            let entry = state.sources.entry(source.key.clone()).or_default();
            match catch_up(&writer, &inner.fields, source, entry, distrusted.contains(&source.key)) {
                Ok(caught) => {
                    done.sources += 1;
                    done.bytes += caught.bytes;
                    done.records += caught.records;
                    done.reindexed += usize::from(caught.reindexed);
                }
                Err(e) => {
                    // Gone or unreadable: its documents go, and it is looked at afresh
                    // next time.
                    tracing::warn!(transcript = %source.path.display(), error = %e, "history index: transcript not read");
                    writer.delete_term(Term::from_field_text(inner.fields.source, &source.key));
                    state.sources.remove(&source.key);
                }
            }
        }
        let payload = serde_json::to_string(&state).map_err(|e| self.damaged(e.to_string()))?;
        let mut prepared = writer.prepare_commit().map_err(|e| self.damaged(e.to_string()))?;
        prepared.set_payload(&payload);
        prepared.commit().map_err(|e| self.damaged(e.to_string()))?;
        // Merges finish before the lock goes, so segments do not pile up.
        if let Err(e) = writer.wait_merging_threads() {
            tracing::warn!(error = %e, "history index: a merge failed");
        }
        inner.reader.reload().map_err(|e| self.damaged(e.to_string()))?;
        Ok(done)
    }

    /// Searches `request.sources` (brought up to date first).
    pub fn search(&self, request: &SearchRequest<'_>) -> Result<Found, HistoryError> {
        let query = request.query.trim();
        if query.is_empty() {
            return Err(HistoryError::Invalid("the query is empty".into()));
        }
        if query.len() > MAX_QUERY {
            return Err(HistoryError::Invalid(format!("the query is longer than {MAX_QUERY} bytes")));
        }
        let mut found = Found::default();
        let refreshed = self.refresh(request.sources)?;
        if refreshed.busy {
            found.notes.push("another ctxd process was updating the index: the newest records may be missing".into());
        }
        match self.search_committed(request, query, &mut found) {
            Ok(()) => Ok(found),
            Err(why) => {
                // A damaged index: moved aside, built again for these transcripts, asked
                // once more.
                self.rebuild(&why)?;
                self.refresh(request.sources)?;
                let mut again = Found::default();
                self.search_committed(request, query, &mut again).map_err(|m| self.damaged(m))?;
                Ok(again)
            }
        }
    }

    fn search_committed(&self, request: &SearchRequest<'_>, query: &str, found: &mut Found) -> Result<(), String> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let f = inner.fields;
        let state = inner.state()?;
        if request.sources.is_empty() {
            return Ok(());
        }
        let terms = recall::query_terms(query);
        let (parsed, plain) = parse_query(&inner.index, f, query);
        let (Some(parsed), false) = (parsed, terms.is_empty()) else {
            found.notes.push("the query has no words to search for".into());
            return Ok(());
        };
        if plain {
            found.notes.push("the query syntax could not be read, so its words were searched as plain text".into());
        }
        let scope: Box<dyn Query> =
            Box::new(TermSetQuery::new(request.sources.iter().map(|s| Term::from_field_text(f.source, &s.key))));
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, parsed), (Occur::Must, scope)];
        if request.before_compaction_only {
            let before: Vec<(Occur, Box<dyn Query>)> = request
                .sources
                .iter()
                .filter_map(|s| Some((s, state.sources.get(&s.key)?.boundaries.latest()?)))
                .map(|(s, boundary)| {
                    let source: Box<dyn Query> =
                        Box::new(TermQuery::new(Term::from_field_text(f.source, &s.key), IndexRecordOption::Basic));
                    let earlier: Box<dyn Query> = Box::new(RangeQuery::new(
                        std::ops::Bound::Included(Term::from_field_u64(f.offset, 0)),
                        std::ops::Bound::Excluded(Term::from_field_u64(f.offset, boundary)),
                    ));
                    (
                        Occur::Should,
                        Box::new(BooleanQuery::new(vec![(Occur::Must, source), (Occur::Must, earlier)]))
                            as Box<dyn Query>,
                    )
                })
                .collect();
            if before.is_empty() {
                found.notes.push("no session searched has been compacted".into());
                return Ok(());
            }
            clauses.push((Occur::Must, Box::new(BooleanQuery::new(before))));
        }
        let searcher = inner.reader.searcher();
        let fetch = (request.limit * 4).clamp(20, 200);
        let top = searcher
            .search(&BooleanQuery::new(clauses), &TopDocs::with_limit(fetch).order_by_score())
            .map_err(|e| e.to_string())?;
        let by_key: HashMap<&str, &Source> = request.sources.iter().map(|s| (s.key.as_str(), s)).collect();
        let mut candidates = Vec::with_capacity(top.len());
        for (score, address) in top {
            let doc: TantivyDocument = searcher.doc(address).map_err(|e| e.to_string())?;
            let text = |field| doc.get_first(field).and_then(|v| v.as_str()).map(str::to_owned);
            let (Some(key), Some(uuid), Some(offset), Some(role)) = (
                text(f.source),
                text(f.uuid),
                doc.get_first(f.offset).and_then(|v| v.as_u64()),
                text(f.role).as_deref().and_then(Role::parse),
            ) else {
                return Err("a document lacks its fields".into());
            };
            let timestamp = text(f.timestamp).filter(|t| !t.is_empty());
            let recency =
                timestamp.as_deref().and_then(ctxd_core::view::time::parse_rfc3339_ms).unwrap_or(offset as i64);
            let preferred = request.preferred == Some(key.as_str());
            candidates.push(Candidate { score, role, uuid, recency, preferred, item: (key, offset, timestamp) });
        }
        // Read back from the files, a few more than asked in case some are refused.
        let mut files: HashMap<String, Option<File>> = HashMap::new();
        for c in recall::rerank(candidates, request.limit + 8) {
            if found.hits.len() == request.limit {
                break;
            }
            let (key, offset, timestamp) = c.item;
            let Some(source) = by_key.get(key.as_str()) else { continue };
            let file = files
                .entry(key.clone())
                .or_insert_with(|| crate::outside::open_regular(&source.path).ok().map(|(f, _)| f));
            let confirmed = file.as_ref().and_then(|file| confirm(file, offset, &c.uuid));
            let Some(text) = confirmed else {
                tracing::info!(transcript = %source.path.display(), offset, "history index: a hit is no longer in its transcript; indexing it again");
                self.distrusted.lock().unwrap_or_else(|p| p.into_inner()).insert(key);
                continue;
            };
            let before_compaction = state.sources.get(&key).is_some_and(|st| st.boundaries.before_latest(offset));
            found.hits.push(Hit {
                source: (*source).clone(),
                uuid: c.uuid,
                timestamp,
                role: c.role,
                snippet: recall::snippet(&text, &terms, SNIPPET_CHARS),
                before_compaction,
            });
        }
        Ok(())
    }

    /// A record and its neighbours on the chain, read from the transcript itself.
    pub fn read(
        &self,
        source: &Source,
        uuid: &str,
        before: usize,
        after: usize,
        max_chars: usize,
    ) -> Result<Read, HistoryError> {
        read::read(
            source,
            uuid,
            before.min(MAX_NEIGHBOURS),
            after.min(MAX_NEIGHBOURS),
            max_chars.clamp(1, MAX_READ_CHARS),
        )
    }

    /// Size of the index on disk, in bytes.
    pub fn disk_bytes(&self) -> u64 {
        fn walk(dir: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.dir)
    }

    /// `f` on the open index; when it finds the index damaged, the index is built again
    /// and `f` asked once more.
    fn read_inner<T>(&self, f: impl Fn(&Inner) -> Result<T, String>) -> Result<T, HistoryError> {
        let first = f(&self.inner.read().unwrap_or_else(|p| p.into_inner()));
        match first {
            Ok(value) => Ok(value),
            Err(why) => {
                self.rebuild(&why)?;
                f(&self.inner.read().unwrap_or_else(|p| p.into_inner())).map_err(|m| self.damaged(m))
            }
        }
    }

    /// Moves the index aside and starts an empty one.
    fn rebuild(&self, why: &str) -> Result<(), HistoryError> {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        tracing::warn!(dir = %self.dir.display(), why, "history index damaged: moved aside and built again");
        move_aside(&self.dir);
        *inner = open_or_rebuild(&self.dir)?;
        Ok(())
    }

    fn damaged(&self, message: String) -> HistoryError {
        HistoryError::Index { path: self.dir.clone(), message }
    }
}

fn index_error(path: &Path, e: impl std::fmt::Display) -> HistoryError {
    HistoryError::Index { path: path.to_owned(), message: e.to_string() }
}

/// Opens the index at `dir`, or, when it cannot be read, moves it aside and creates a
/// new one.
fn open_or_rebuild(dir: &Path) -> Result<Inner, HistoryError> {
    crate::store::create_private_dir(dir).map_err(|e| index_error(dir, e))?;
    match Inner::open(dir) {
        Ok(inner) => Ok(inner),
        Err(why) => {
            tracing::warn!(dir = %dir.display(), why, "history index cannot be read: moved aside and built again");
            move_aside(dir);
            crate::store::create_private_dir(dir).map_err(|e| index_error(dir, e))?;
            Inner::open(dir).map_err(|m| index_error(dir, m))
        }
    }
}

/// Renames a damaged index to `history.damaged`, replacing an older one: a cache, kept
/// once for a look at what went wrong, never piling up.
fn move_aside(dir: &Path) {
    let aside = dir.with_extension("damaged");
    let _ = std::fs::remove_dir_all(&aside);
    if let Err(e) = std::fs::rename(dir, &aside) {
        tracing::warn!(dir = %dir.display(), error = %e, "history index: cannot move aside; removing it");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The index's writer, waiting up to [`WRITER_WAIT`] while another process holds it;
/// `None` if it still does.
fn acquire_writer(index: &Index, dir: &Path) -> Result<Option<IndexWriter>, HistoryError> {
    let deadline = Instant::now() + WRITER_WAIT;
    loop {
        match index.writer_with_num_threads(1, WRITER_BUDGET) {
            Ok(writer) => return Ok(Some(writer)),
            Err(tantivy::TantivyError::LockFailure(tantivy::directory::error::LockError::LockBusy, _)) => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(index_error(dir, e)),
        }
    }
}

/// Whether the file at `path` differs from what was indexed (or was never indexed):
/// its identity, length or time changed, or, for a rewrite the clock's granularity
/// hides (same length within one tick), the bytes just before the offset indexed to.
fn changed(indexed: Option<&SourceState>, path: &Path) -> bool {
    let Some(st) = indexed else { return true };
    let Ok(meta) = std::fs::metadata(path) else { return true };
    if (meta.dev(), meta.ino(), meta.len(), mtime_ns(&meta)) != (st.dev, st.ino, st.len, st.mtime_ns) {
        return true;
    }
    match crate::outside::open_regular(path) {
        Ok((file, _)) => tail_hash(&file, st.indexed_to).map_or(true, |tail| tail != st.tail),
        Err(_) => true,
    }
}

fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    let secs = u64::try_from(meta.mtime()).unwrap_or(0);
    let nanos = u64::try_from(meta.mtime_nsec()).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// FNV-1a of the (up to) 64 bytes before `at`.
fn tail_hash(file: &File, at: u64) -> std::io::Result<u64> {
    let n = at.min(64) as usize;
    let mut bytes = [0u8; 64];
    file.read_exact_at(&mut bytes[..n], at - n as u64)?;
    Ok(ctxd_core::ledger::fnv1a(&bytes[..n]))
}

/// What one transcript's catch-up did.
struct Caught {
    bytes: u64,
    records: u64,
    reindexed: bool,
}

/// Indexes what `source` holds past `st.indexed_to`, or all of it when the file is not
/// the one indexed (another file, shorter, or other bytes under the offset) or `force`.
fn catch_up(
    writer: &IndexWriter,
    f: &Fields,
    source: &Source,
    st: &mut SourceState,
    force: bool,
) -> std::io::Result<Caught> {
    let (file, len) = crate::outside::open_regular(&source.path)?;
    let meta = file.metadata()?;
    let same_file = st.dev == meta.dev() && st.ino == meta.ino();
    let reindexed = force
        || (st.indexed_to > 0 && (!same_file || len < st.indexed_to || tail_hash(&file, st.indexed_to)? != st.tail));
    if reindexed || st.indexed_to == 0 {
        writer.delete_term(Term::from_field_text(f.source, &source.key));
        *st = SourceState::default();
    }
    (st.dev, st.ino, st.len, st.mtime_ns) = (meta.dev(), meta.ino(), len, mtime_ns(&meta));
    let from = st.indexed_to;
    let mut records = 0;
    let mut lines = lines::Lines::from_file(file.try_clone()?, from, len, LINE_CAP)?;
    while let Some(item) = lines.next_item()? {
        let (offset, bytes) = match item {
            lines::Item::Line { offset, bytes } => (offset, bytes),
            lines::Item::TooLong { offset, len } => {
                tracing::warn!(transcript = %source.path.display(), offset, len, "history index: a line longer than {LINE_CAP} bytes is left out");
                st.skipped += 1;
                continue;
            }
        };
        let Some(line) = std::str::from_utf8(bytes).ok().and_then(|t| recall::extract(t, MAX_INDEXED_TEXT)) else {
            if !bytes.iter().all(u8::is_ascii_whitespace) {
                st.skipped += 1;
            }
            continue;
        };
        st.boundaries.observe(offset, &line);
        if st.cwd.is_none() {
            st.cwd.clone_from(&line.cwd);
        }
        if let (What::Entry(entry), Some(uuid)) = (line.what, line.uuid) {
            let mut doc = TantivyDocument::default();
            doc.add_text(f.source, &source.key);
            doc.add_text(f.uuid, &uuid);
            doc.add_u64(f.offset, offset);
            doc.add_text(f.timestamp, line.timestamp.as_deref().unwrap_or(""));
            doc.add_text(f.role, entry.role.as_str());
            doc.add_text(f.text, &entry.text);
            writer.add_document(doc).map_err(std::io::Error::other)?;
            records += 1;
        }
    }
    st.indexed_to = lines.complete_to();
    st.tail = tail_hash(&file, st.indexed_to)?;
    st.records += records;
    Ok(Caught { bytes: st.indexed_to - from, records, reindexed })
}

/// The text of the record at `offset` if it is still the one with `uuid`.
fn confirm(file: &File, offset: u64, uuid: &str) -> Option<String> {
    let bytes = lines::line_at(file, offset, LINE_CAP).ok()??;
    let line = recall::extract(std::str::from_utf8(&bytes).ok()?, MAX_INDEXED_TEXT)?;
    match line.what {
        What::Entry(entry) if line.uuid.as_deref() == Some(uuid) => Some(entry.text),
        _ => None,
    }
}

/// The query as tantivy reads it (words, "phrases", `role:user`, AND/OR/NOT), or, when
/// it cannot, as plain text (`true`): each piece between spaces a word, or a phrase of
/// the words it splits into (`MARKER-BIG` is `"marker big"`, as the parser reads it).
/// `None`: no words at all.
fn parse_query(index: &Index, f: Fields, query: &str) -> (Option<Box<dyn Query>>, bool) {
    let parser = QueryParser::for_index(index, vec![f.text]);
    if let Ok(parsed) = parser.parse_query(query) {
        return (Some(parsed), false);
    }
    let pieces: Vec<(Occur, Box<dyn Query>)> = query
        .split_whitespace()
        .filter_map(|piece| {
            let terms: Vec<Term> =
                recall::query_terms(piece).iter().map(|t| Term::from_field_text(f.text, t)).collect();
            let q: Box<dyn Query> = match terms.len() {
                0 => return None,
                1 => Box::new(TermQuery::new(terms[0].clone(), IndexRecordOption::WithFreqs)),
                _ => Box::new(PhraseQuery::new(terms)),
            };
            Some((Occur::Should, q))
        })
        .collect();
    if pieces.is_empty() {
        return (None, true);
    }
    (Some(Box::new(BooleanQuery::new(pieces))), true)
}
