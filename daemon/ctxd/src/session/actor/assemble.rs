//! Building the next model request: the request pipeline over the view, what it decided
//! persisted first, and the answer cut to what changed since the host's last request.

use std::sync::Arc;
use std::time::Instant;

use ctxd_core::breakdown::Prefix;
use ctxd_core::compact::lifecycle::is_model_response;
use ctxd_core::ledger::LedgerEntry;
use ctxd_core::record::Record;
use ctxd_core::view::{ApiMessage, ViewCache};

use super::commit::{attachment_record, own_record};
use super::{AssembleAnswer, AssembleRequest, AssembleSteps, Session};
use crate::context::base::BaseContext;
use crate::session::SessionError;
use crate::session::usage::Shape;

/// What the session keeps of the requests it builds: the host's part of the latest, the
/// pipeline's memo, and the requests handed out (for `since` and for a fork).
pub(super) struct Requests {
    /// Token estimates of the host's own system blocks and tool definitions, from its
    /// latest `ctx/assemble` (the host sends them with every request).
    prefix: HostPrefix,
    /// The host's own part of its latest `ctx/assemble` (not a fork's), so a compaction
    /// can rebuild the request the host would be sent and fork it to share its cache.
    /// `None` until the host assembles in this daemon's lifetime.
    host: Option<Arc<HostRequest>>,
    /// The request pipeline's memo: extended with what was appended, rebuilt when a
    /// stage's inputs changed.
    cache: ViewCache,
    /// The last request handed out, for an assemble `since` it.
    last_sent: Option<SentRequest>,
    /// The latest requests the host was handed to send, whole: an automatic compaction
    /// forks the newest one already answered, whose prefix the provider has cached.
    fork_parents: ForkParents,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            prefix: HostPrefix::default(),
            host: None,
            cache: ViewCache::new(),
            last_sent: None,
            fork_parents: ForkParents::default(),
        }
    }
}

impl Requests {
    /// The view was rebuilt from disk: nothing built on the old one is extended.
    pub(super) fn view_replaced(&mut self) {
        self.cache = ViewCache::new();
        self.last_sent = None;
    }

    /// A boundary was folded in: the request handed out last shows the old view, no
    /// later one shares more than a message with it, and it would keep the old view's
    /// messages alive.
    pub(super) fn boundary_folded(&mut self) {
        self.last_sent = None;
    }

    /// The host's latest blocks, if it assembled in this daemon's lifetime.
    pub(super) fn host(&self) -> Option<Arc<HostRequest>> {
        self.host.clone()
    }

    /// Where the messages of a request answered `since` a revision start: after those
    /// it shares with the request handed out under that revision (0: all of them).
    fn messages_from(&self, since: Option<&str>, messages: &[Arc<ApiMessage>]) -> usize {
        match (since, &self.last_sent) {
            (Some(since), Some(last)) if since == last.revision => {
                ctxd_core::view::shared_messages(&last.messages, messages)
            }
            _ => 0,
        }
    }

    /// A request was handed out under `revision`; its messages are kept for the next
    /// `since` (shared with the view cache: keeping them costs pointers).
    fn handed_out(&mut self, revision: String, messages: Vec<Arc<ApiMessage>>) {
        self.last_sent = Some(SentRequest { revision, messages });
    }

    /// The newest request the model answered on the current view, to fork.
    pub(super) fn answered_parent(&self, view: &[Record], view_generation: u64) -> Option<&ForkParent> {
        self.fork_parents.answered(view, view_generation)
    }
}

/// What the host sends with every request besides the view: its system blocks, tools,
/// reply cap and thinking settings. Moved out of the assemble request, never copied.
#[derive(Debug)]
pub(super) struct HostRequest {
    system: Vec<serde_json::Value>,
    tools: Vec<serde_json::Value>,
    max_tokens: u64,
    thinking: Option<serde_json::Value>,
}

impl HostRequest {
    pub(super) fn blocks(&self) -> HostBlocks<'_> {
        HostBlocks {
            system: &self.system,
            tools: &self.tools,
            max_tokens: self.max_tokens,
            thinking: self.thinking.as_ref(),
        }
    }
}

/// The host's part of a request, borrowed: from `ctx/assemble`'s params or from the
/// latest [`HostRequest`].
#[derive(Debug, Clone, Copy)]
pub(super) struct HostBlocks<'a> {
    pub(super) system: &'a [serde_json::Value],
    pub(super) tools: &'a [serde_json::Value],
    pub(super) max_tokens: u64,
    pub(super) thinking: Option<&'a serde_json::Value>,
}

#[derive(Debug, Clone, Copy, Default)]
struct HostPrefix {
    system: u64,
    tools: u64,
}

impl Session {
    /// Builds the next request: base context rebuilt if a source changed, changed files
    /// and newly activated memory files appended as attachment records (so resume
    /// rebuilds the same request), the pipeline run on the view, its state changes
    /// persisted before the request is handed out.
    pub(super) async fn assemble(
        &mut self,
        mut request: AssembleRequest,
        may_compact: bool,
    ) -> Result<AssembleAnswer, SessionError> {
        let started = Instant::now();
        // Without a working watcher (the OS limit was hit), compare stamps instead.
        if self.setup.services.watcher.degraded() {
            let seen = std::mem::take(&mut self.context.stamps);
            let memory: Vec<std::path::PathBuf> = self
                .context
                .base
                .as_ref()
                .map(|b| b.watch_targets().into_iter().map(|(p, _)| p).collect())
                .unwrap_or_default();
            let reads: Vec<LedgerEntry> = self.context.reads.ledger().newest_first().into_iter().cloned().collect();
            let (changed, stamps) =
                tokio::task::spawn_blocking(move || crate::context::watcher::look_again(&seen, memory, &reads))
                    .await
                    .unwrap_or_default();
            self.context.stamps = stamps;
            if !changed.is_empty() {
                self.files_changed(changed).await;
            }
            self.resubscribe();
        }
        if self.context.base.as_ref().is_some_and(BaseContext::is_dirty)
            && let Some(mut base) = self.context.base.take()
        {
            let services = self.setup.services.clone();
            let reads = self.context.reads.since_reload();
            let rebuilt = tokio::task::spawn_blocking(move || {
                base.rebuild_if_dirty(&services.memory_cache, &services.fs, &reads);
                base
            })
            .await
            .map_err(|e| SessionError::Internal(format!("base context task failed: {e}")))?;
            self.context.base = Some(rebuilt);
            self.resubscribe();
        }
        let notes = self.take_context_notes().await;
        if !notes.is_empty() {
            let records =
                notes.into_iter().map(|(kind, text)| attachment_record(kind, &text)).collect::<Result<Vec<_>, _>>()?;
            self.commit_own(records).await?;
        }
        let host = HostBlocks {
            system: &request.system,
            tools: &request.tools,
            max_tokens: request.max_tokens,
            thinking: request.thinking.as_ref(),
        };
        let assembled = self.run_pipeline(host, request.fork.as_ref());
        let tool_results_dir = self.tool_results_dir();
        let (system_bytes, tools_bytes) = (json_len(&request.system), json_len(&request.tools));
        let rate = self.view.tally.calibration;
        self.requests.prefix =
            HostPrefix { system: rate.tokens(system_bytes as u64), tools: rate.tokens(tools_bytes as u64) };
        if request.fork.is_none() {
            // Before a compaction can start below: its parent is this request.
            let system = std::mem::take(&mut request.system);
            let tools = std::mem::take(&mut request.tools);
            let thinking = request.thinking.take();
            self.requests.host =
                Some(Arc::new(HostRequest { system, tools, max_tokens: request.max_tokens, thinking }));
        }
        // Persist what the pipeline decided (offloaded results, cleared results,
        // reminders) before anyone sees a request that depends on it.
        if !assembled.new_state.is_empty() {
            let offloads: Vec<(String, String)> =
                assembled.new_state.offloads.iter().map(|o| (o.replacement.path.clone(), o.content.clone())).collect();
            let dir = tool_results_dir.clone();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                crate::store::create_private_dir(std::path::Path::new(&dir))
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                for (path, content) in offloads {
                    std::fs::write(path, content)?;
                }
                Ok(())
            })
            .await
            .map_err(|e| SessionError::Internal(format!("offload task failed: {e}")))?
            .map_err(|e| SessionError::Store(format!("writing offloaded tool results: {e}")))?;
            let records = assembled
                .new_state
                .records()
                .into_iter()
                .map(|object| own_record(object).map(|(record, _)| record))
                .collect::<Result<Vec<_>, _>>()?;
            self.commit_own(records).await?;
        }
        let mut compact = false;
        if let ctxd_core::view::CompactDecision::Compact { tokens, .. } = assembled.decision
            && may_compact
            && self.setup.thresholds.auto_compact_enabled
        {
            // Through the same guards as after an append: a stopped session (thrashing,
            // circuit breaker) does not compact from here either, and says "continue".
            let view_before = self.view.generation;
            self.pipeline_due(tokens.max(self.next_tokens())).await;
            // Running now, or a summary prepared ahead was installed just now: either
            // way the host waits for the compacted view.
            compact = self.compaction.compacting() || self.view.generation != view_before;
        }
        // The UI's view: after the state records above, so it marks what this request
        // already left out.
        let scrollback = request.include_snipped.then(|| {
            let (state, config) =
                (ctxd_core::view::PipelineState::default(), ctxd_core::view::PipelineConfig::default());
            ctxd_core::view::scrollback(&self.view.records, &state, &config)
        });
        // A host that kept the request it was sent last is sent only what changed since:
        // the per-turn answer stays the size of the turn, not of the session.
        let messages_from = self.requests.messages_from(request.since.as_deref(), &assembled.request.messages);
        if request.fork.is_none() && !compact {
            // The host sends this one: once answered, its prefix is what a fork reads.
            self.requests.fork_parents.push(ForkParent {
                request: assembled.request.clone(),
                view_len: self.view.records.len(),
                view_generation: self.view.generation,
            });
        }
        let revision = next_revision();
        // The messages are kept for the next `since`: a whole request shares them with
        // the answer, a tail is cut from them.
        let (request, kept) = if messages_from == 0 {
            let kept = assembled.request.messages.clone();
            (assembled.request, kept)
        } else {
            (assembled.request.messages_from(messages_from), assembled.request.messages)
        };
        self.requests.handed_out(revision.clone(), kept);
        // The host's blocks, the model and the envelope's few fields on top of the
        // messages, whose length is exact.
        let request_len_hint = request.messages_json_len() + system_bytes + tools_bytes + request.model.len() + 256;
        Ok(AssembleAnswer {
            request,
            request_len_hint,
            revision,
            messages_from,
            request_tokens: assembled.estimate_tokens,
            usage: self.usage(),
            applied: assembled.applied,
            compact,
            scrollback,
            steps: AssembleSteps { started, built: Instant::now() },
        })
    }

    /// The request pipeline over the view with the host's blocks and the base context.
    /// `ctx/assemble` and a compaction's parent both come from here, so the fork's prefix
    /// is the bytes the host is sent (and the provider cached). Decisions it makes come
    /// back in `new_state`; `assemble` persists them, and the view cache makes them
    /// again until they are.
    pub(super) fn run_pipeline(
        &mut self,
        host: HostBlocks<'_>,
        fork: Option<&ctxd_core::view::Fork>,
    ) -> ctxd_core::view::Assembled {
        let base = self.base_for_pipeline();
        let tool_results_dir = self.tool_results_dir();
        let state = ctxd_core::view::PipelineState::default();
        let config = ctxd_core::view::PipelineConfig::default();
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let thresholds = &self.setup.thresholds;
        let threshold = (thresholds.auto_compact_enabled && thresholds.enforce_window).then_some(thresholds.threshold);
        // The pipeline's check takes the snips and collapses recorded since the last
        // response off this figure itself: handed over with them still counted, so
        // they are taken off once.
        let anchored_tokens = Some(self.next_tokens() + self.view.tally.reduced_since_report);
        let input = ctxd_core::view::AssembleInput {
            records: &self.view.records,
            system: host.system,
            tools: host.tools,
            model: &self.setup.model,
            max_tokens: host.max_tokens,
            thinking: host.thinking,
            fork,
            base: &base,
            now_ms,
            state: &state,
            config: &config,
            tool_results_dir: &tool_results_dir,
            compact: ctxd_core::view::CompactCheck { threshold, anchored_tokens },
        };
        self.requests.cache.assemble(&input)
    }

    /// The base context as the pipeline takes it.
    pub(super) fn base_for_pipeline(&self) -> ctxd_core::view::BaseContext {
        let base = self.context.base.as_ref();
        ctxd_core::view::BaseContext {
            system_context: base.and_then(|b| b.system_context().map(|s| s.to_string())),
            user_context: base.and_then(|b| b.user_context().map(|s| s.to_string())),
            attachments: Vec::new(),
        }
    }

    /// Where the pipeline offloads this session's large tool results.
    pub(super) fn tool_results_dir(&self) -> String {
        self.store.root().join("tool-results").join(&self.id).display().to_string()
    }

    /// The view as a plain request body (no host blocks): what a provider summarizes.
    pub(super) fn parent_request(&self, records: &[Record]) -> serde_json::Value {
        ctxd_core::view::plain_request(records, &self.setup.model)
    }

    /// The parts of the next request that no compaction can remove (the host's system
    /// prompt and tools count once `ctx/assemble` has seen them).
    pub(super) fn fixed_prefix(&self) -> u64 {
        let prefix = self.shape().prefix;
        prefix.system_prompt + prefix.tools + prefix.memory_files
    }

    /// What the session knows of its next request beyond the tally.
    pub(super) fn shape(&self) -> Shape {
        let base = self.context.base.as_ref();
        let rate = self.view.tally.calibration;
        let system_context = base.and_then(BaseContext::system_context).map_or(0, |s| rate.tokens(s.len() as u64));
        let host = self.requests.prefix;
        Shape {
            prefix: Prefix {
                system_prompt: host.system + system_context,
                tools: host.tools,
                memory_files: base.map_or(0, BaseContext::memory_tokens),
                skills: rate.tokens(self.view.invoked.skill_bytes()),
            },
            pending: self.context.pending_notes.iter().map(|n| rate.tokens(n.len() as u64)).sum(),
            composition: self.view.composition,
        }
    }

    /// Tokens the next request carries: the one figure for usage, levels and triggers.
    pub(super) fn next_tokens(&self) -> u64 {
        let shape = self.shape();
        ctxd_core::breakdown::next_request_tokens(&self.view.tally, &shape.prefix, shape.pending)
    }
}

/// The length of `values` as JSON text, counted as it is written (nothing is kept).
fn json_len(values: &[serde_json::Value]) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, values).map_or(0, |()| count.0)
}

/// A request the host was handed to send, and the view it was built from.
pub(super) struct ForkParent {
    /// As handed out, markers included: shared with the view cache.
    pub(super) request: ctxd_core::view::Request,
    /// The view's first `view_len` records are what it carries.
    pub(super) view_len: usize,
    pub(super) view_generation: u64,
}

/// The two latest requests handed out (the newest may not be answered yet).
#[derive(Default)]
struct ForkParents {
    newest: Option<ForkParent>,
    previous: Option<ForkParent>,
}

impl ForkParents {
    fn push(&mut self, parent: ForkParent) {
        self.previous = self.newest.take().filter(|p| p.view_generation == parent.view_generation);
        self.newest = Some(parent);
    }

    /// The newest request the model has answered on the current view (a response was
    /// appended after the records it carries): the provider cached its prefix, so a
    /// fork of exactly it reads all of it. Records appended since are not in it.
    pub(super) fn answered(&self, view: &[Record], view_generation: u64) -> Option<&ForkParent> {
        [self.newest.as_ref(), self.previous.as_ref()].into_iter().flatten().find(|p| {
            p.view_generation == view_generation
                && view.get(p.view_len..).is_some_and(|after| after.iter().any(is_model_response))
        })
    }
}

/// The request a session answered last, as the host holds it.
struct SentRequest {
    revision: String,
    /// Shared with the view cache: keeping them costs pointers.
    messages: Vec<Arc<ApiMessage>>,
}

/// A new assemble revision: a counter behind a prefix drawn when the daemon starts, so a
/// revision a host kept from an earlier daemon never names a request of this one.
fn next_revision() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_owned());
    format!("{prefix}-{}", COUNTER.fetch_add(1, Ordering::Relaxed) + 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use ctxd_core::view::{ApiMessage, Role};

    use super::Requests;

    #[test]
    fn an_answer_since_the_last_request_leaves_out_what_they_share_until_the_view_changes() {
        let message = |role| Arc::new(ApiMessage { role, content: Vec::new() });
        let sent = vec![message(Role::User), message(Role::Assistant)];
        let now = [sent.clone(), vec![message(Role::User)]].concat();
        let mut requests = Requests::default();
        assert_eq!(requests.messages_from(Some("r1"), &now), 0, "nothing handed out yet");
        requests.handed_out("r1".into(), sent.clone());
        assert_eq!(requests.messages_from(Some("r1"), &now), 2);
        assert_eq!(requests.messages_from(Some("r0"), &now), 0, "another revision");
        assert_eq!(requests.messages_from(None, &now), 0, "no revision");
        requests.boundary_folded();
        assert_eq!(requests.messages_from(Some("r1"), &now), 0, "a boundary replaced what it showed");
        requests.handed_out("r2".into(), sent);
        requests.view_replaced();
        assert_eq!(requests.messages_from(Some("r2"), &now), 0, "the view was rebuilt from disk");
    }

    #[test]
    pub(super) fn json_len_counts_the_bytes_serde_writes() {
        let values = vec![
            serde_json::json!({"type": "text", "text": "a \"quoted\" ünï\n"}),
            serde_json::json!([1, 2.5, {"k": null}]),
        ];
        assert_eq!(super::json_len(&values), serde_json::to_string(&values).unwrap().len());
        assert_eq!(super::json_len(&[]), 2);
    }
}
