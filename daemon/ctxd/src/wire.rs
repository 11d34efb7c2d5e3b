//! Conversion of domain values to the protocol's types (`ctxd_proto`): the one place
//! where the core's and the daemon's types become what travels on the wire, so the wire
//! can stay stable while they move. Every match here is exhaustive: a new domain value
//! fails to compile until it has a wire name.

use ctxd_core::budget::WindowSource;
use ctxd_core::compact::Trigger;
use ctxd_core::memory::{MemoryKind, Status};
use ctxd_core::view::Stage;
use ctxd_proto as proto;

use crate::session::compaction::{Summarizer, SummaryPath};

pub fn trigger(trigger: Trigger) -> proto::Trigger {
    match trigger {
        Trigger::Manual => proto::Trigger::Manual,
        Trigger::Auto => proto::Trigger::Auto,
        Trigger::Reactive => proto::Trigger::Reactive,
        Trigger::Idle => proto::Trigger::Idle,
        Trigger::Partial => proto::Trigger::Partial,
        Trigger::Precomputed => proto::Trigger::Precomputed,
    }
}

/// Who wrote a summary. The daemon names its summarizers with the provider's name
/// (`RemoteProvider::name`) or `offline`; a name without a wire value is a bug, reported
/// as an internal error rather than sent under another name.
pub fn summarizer(summarizer: &Summarizer) -> Result<proto::Summarizer, String> {
    match summarizer.name {
        "offline" => Ok(proto::Summarizer::Offline),
        "anthropic" => Ok(proto::Summarizer::Anthropic),
        "openai" => Ok(proto::Summarizer::Openai),
        other => Err(format!("summarizer {other:?} has no protocol name")),
    }
}

pub fn summary_path(path: SummaryPath) -> proto::SummaryPath {
    match path {
        SummaryPath::Fork => proto::SummaryPath::Fork,
        SummaryPath::Fallback => proto::SummaryPath::Fallback,
    }
}

pub fn stage(stage: Stage) -> proto::Stage {
    match stage {
        Stage::Normalize => proto::Stage::Normalize,
        Stage::Slice => proto::Stage::Slice,
        Stage::Place => proto::Stage::Place,
        Stage::Snip => proto::Stage::Snip,
        Stage::Collapse => proto::Stage::Collapse,
        Stage::ToolResultBudget => proto::Stage::ToolResultBudget,
        Stage::Microcompact => proto::Stage::Microcompact,
        Stage::CacheBreakpoints => proto::Stage::CacheBreakpoints,
        Stage::CompactCheck => proto::Stage::CompactCheck,
    }
}

pub fn memory_kind(kind: MemoryKind) -> proto::MemoryKind {
    match kind {
        MemoryKind::Managed => proto::MemoryKind::Managed,
        MemoryKind::User => proto::MemoryKind::User,
        MemoryKind::Project => proto::MemoryKind::Project,
        MemoryKind::Local => proto::MemoryKind::Local,
        MemoryKind::Rule => proto::MemoryKind::Rule,
        MemoryKind::Nested => proto::MemoryKind::Nested,
        MemoryKind::AutoMemory => proto::MemoryKind::AutoMemory,
        MemoryKind::Import => proto::MemoryKind::Import,
    }
}

pub fn memory_status(status: Status) -> proto::MemoryStatus {
    match status {
        Status::Active => proto::MemoryStatus::Loaded,
        Status::Pending => proto::MemoryStatus::Waiting,
        Status::Duplicate => proto::MemoryStatus::Duplicate,
    }
}

pub fn window_source(source: WindowSource) -> proto::WindowSource {
    match source {
        WindowSource::Env => proto::WindowSource::Env,
        WindowSource::Setting => proto::WindowSource::Setting,
        WindowSource::Client => proto::WindowSource::Client,
        WindowSource::Experiment => proto::WindowSource::Experiment,
        WindowSource::ModelDefault => proto::WindowSource::ModelDefault,
        WindowSource::SubagentCeiling => proto::WindowSource::SubagentCeiling,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The wire's name of a value, as serde writes it.
    fn name<T: serde::Serialize>(value: T) -> String {
        serde_json::to_value(value).unwrap().as_str().unwrap().to_owned()
    }

    #[test]
    fn wire_names_are_the_domains_own() {
        use Trigger::*;
        for t in [Manual, Auto, Reactive, Idle, Partial, Precomputed] {
            assert_eq!(name(trigger(t)), t.as_str());
        }
        use Stage::*;
        for s in
            [Normalize, Slice, Place, Snip, Collapse, ToolResultBudget, Microcompact, CacheBreakpoints, CompactCheck]
        {
            assert_eq!(name(stage(s)), s.as_str());
            assert_eq!(name(stage(s)), name(s), "the core's serde name is the wire's");
        }
        use MemoryKind::*;
        for k in [Managed, User, Project, Local, Rule, Nested, AutoMemory, Import] {
            assert_eq!(name(memory_kind(k)), k.label());
        }
        for p in [SummaryPath::Fork, SummaryPath::Fallback] {
            assert_eq!(name(summary_path(p)), p.as_str());
        }
    }

    #[test]
    fn every_summarizer_the_daemon_names_has_a_wire_name() {
        for provider in ["anthropic", "openai", "offline"] {
            let s = Summarizer { name: provider, path: None };
            assert_eq!(name(summarizer(&s).unwrap()), provider);
        }
        assert!(summarizer(&Summarizer { name: "someone else", path: None }).is_err());
    }
}
