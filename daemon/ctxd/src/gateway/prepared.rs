//! Prepared summaries of live Claude Code sessions, kept on disk so that a gateway
//! restarted between a preparation and the compaction it was made for still answers it.
//!
//! One file per session under `<state dir>/gateway/prepared/`, named by the SHA-256 of
//! the session id (a session id is whatever a client sent: it never becomes a path).
//! The record holds the model's reply (already checked for fidelity), the hashes that
//! say which conversation it stands for (shape, and the prefix of `covered` messages),
//! and the usage the preparation cost; never a request body or a header. A record is
//! written to a temporary file and renamed over the old one, so a reader sees the old
//! record or the new one; one that does not read back whole (cut, edited, another
//! version) is ignored with one log line, and the request it could have answered is
//! forwarded.

use std::io::Write;
use std::path::{Path, PathBuf};

use ctxd_core::gateway::conversation::Hash;
use ctxd_core::record::TokenUsage;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The record's format; another is ignored.
const VERSION: u32 = 1;
/// Largest record read back (a reply is at most a few hundred kilobytes).
const RECORD: crate::outside::Cap = crate::outside::Cap { bytes: 8 << 20, what: "a prepared summary" };

/// A summary prepared for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub session_id: String,
    pub model: String,
    pub shape: Hash,
    /// Messages the summary covers, and the hash of that prefix.
    pub covered: usize,
    pub prefix: Hash,
    /// The reply, `<analysis>` and `<summary>`, fidelity additions in.
    pub reply: String,
    /// What the preparation cost.
    pub usage: TokenUsage,
    /// The context of the request it forked (for the once-per-growth rule).
    pub at_tokens: u64,
}

impl Prepared {
    /// The one rule for using this summary: it stands for a conversation of `model`
    /// with the system and tools of `shape` whose `messages` start with exactly the
    /// ones it covers (`prefix_of(n)`: the hash of the conversation's first `n`
    /// messages, asked only when it has that many). Else why not.
    pub fn stands_for(
        &self,
        model: &str,
        shape: &Hash,
        messages: usize,
        prefix_of: impl FnOnce(usize) -> Hash,
    ) -> Result<(), String> {
        if self.model != model {
            return Err(format!("prepared for {}, asked of {model}", self.model));
        }
        if self.shape != *shape {
            return Err("its system blocks or tools differ from the prepared summary's".into());
        }
        if messages < self.covered {
            return Err(format!(
                "it covers {messages} messages, fewer than the {} the summary was prepared for",
                self.covered
            ));
        }
        if prefix_of(self.covered) != self.prefix {
            return Err(format!("its first {} messages differ from those the summary was prepared for", self.covered));
        }
        Ok(())
    }

    /// Whether this summary covers the conversation `newest` exactly: it stands for it
    /// and nothing came after what it covers.
    pub fn covers_exactly(&self, newest: &Cover) -> bool {
        newest.messages == self.covered
            && self.stands_for(&newest.model, &newest.shape, newest.messages, |_| newest.prefix).is_ok()
    }
}

/// What identifies a whole conversation for [`Prepared::covers_exactly`]: its model,
/// its shape, its number of messages and the hash of all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cover {
    pub model: String,
    pub shape: Hash,
    pub messages: usize,
    pub prefix: Hash,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Record {
    version: u32,
    session_id: String,
    model: String,
    shape: String,
    covered: usize,
    prefix: String,
    reply: String,
    input_tokens: u64,
    cache_read_input_tokens: u64,
    cache_creation_input_tokens: u64,
    output_tokens: u64,
    at_tokens: u64,
    /// SHA-256 of the fields above in order: a record edited or half-written by hand
    /// does not pass.
    check: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Hash> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn check_of(p: &Prepared) -> String {
    let mut h = Sha256::new();
    for part in [p.session_id.as_bytes(), p.model.as_bytes(), &p.shape, &p.prefix, p.reply.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let u = &p.usage;
    for n in [
        p.covered as u64,
        u.input_tokens,
        u.cache_read_input_tokens,
        u.cache_creation_input_tokens,
        u.output_tokens,
        p.at_tokens,
    ] {
        h.update(n.to_le_bytes());
    }
    hex(&h.finalize())
}

/// The directory of prepared summaries in a state dir.
#[derive(Debug, Clone)]
pub struct PreparedStore {
    dir: PathBuf,
}

impl PreparedStore {
    pub fn new(state_dir: &Path) -> PreparedStore {
        PreparedStore { dir: state_dir.join("gateway").join("prepared") }
    }

    fn path(&self, session_id: &str) -> PathBuf {
        self.dir.join(format!("{}.json", hex(&Sha256::digest(session_id.as_bytes()))))
    }

    /// Writes the record (replacing the session's previous one).
    pub fn save(&self, prepared: &Prepared) -> std::io::Result<()> {
        crate::store::create_private_dir(&self.dir).map_err(std::io::Error::other)?;
        let record = Record {
            version: VERSION,
            session_id: prepared.session_id.clone(),
            model: prepared.model.clone(),
            shape: hex(&prepared.shape),
            covered: prepared.covered,
            prefix: hex(&prepared.prefix),
            reply: prepared.reply.clone(),
            input_tokens: prepared.usage.input_tokens,
            cache_read_input_tokens: prepared.usage.cache_read_input_tokens,
            cache_creation_input_tokens: prepared.usage.cache_creation_input_tokens,
            output_tokens: prepared.usage.output_tokens,
            at_tokens: prepared.at_tokens,
            check: check_of(prepared),
        };
        let path = self.path(&prepared.session_id);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec(&record).map_err(std::io::Error::other)?)?;
        file.sync_data()?;
        drop(file);
        std::fs::rename(&tmp, &path)
    }

    /// The session's record; `None` when there is none, or (said in the log) when it
    /// does not read back whole.
    pub fn load(&self, session_id: &str) -> Option<Prepared> {
        let path = self.path(session_id);
        let bytes = match crate::outside::read(&path, RECORD) {
            Ok(bytes) => bytes,
            Err(crate::outside::OutsideError::Missing) => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "gateway: a prepared summary cannot be read; ignored");
                return None;
            }
        };
        let prepared = serde_json::from_slice::<Record>(&bytes).ok().and_then(|r| {
            let prepared = Prepared {
                session_id: r.session_id,
                model: r.model,
                shape: unhex(&r.shape)?,
                covered: r.covered,
                prefix: unhex(&r.prefix)?,
                reply: r.reply,
                usage: TokenUsage {
                    input_tokens: r.input_tokens,
                    cache_read_input_tokens: r.cache_read_input_tokens,
                    cache_creation_input_tokens: r.cache_creation_input_tokens,
                    output_tokens: r.output_tokens,
                },
                at_tokens: r.at_tokens,
            };
            (r.version == VERSION && r.check == check_of(&prepared) && prepared.session_id == session_id)
                .then_some(prepared)
        });
        if prepared.is_none() {
            tracing::warn!(path = %path.display(), "gateway: a prepared summary's record is damaged; ignored");
        }
        prepared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Prepared {
        Prepared {
            session_id: "s-1".into(),
            model: "claude-opus-5-5".into(),
            shape: [7; 32],
            covered: 12,
            prefix: [9; 32],
            reply: "<summary>x</summary>".into(),
            usage: TokenUsage {
                input_tokens: 1,
                cache_read_input_tokens: 2,
                cache_creation_input_tokens: 3,
                output_tokens: 4,
            },
            at_tokens: 600_000,
        }
    }

    #[test]
    fn it_covers_exactly_only_the_same_model_shape_and_messages() {
        let p = sample();
        let cover = Cover { model: p.model.clone(), shape: p.shape, messages: p.covered, prefix: p.prefix };
        assert!(p.covers_exactly(&cover));
        for (other, why) in [
            (Cover { model: "claude-opus-4-6".into(), ..cover.clone() }, "another model"),
            (Cover { shape: [8; 32], ..cover.clone() }, "other system or tools"),
            (Cover { messages: 13, ..cover.clone() }, "a turn more"),
            (Cover { messages: 11, ..cover.clone() }, "fewer messages"),
            (Cover { prefix: [1; 32], ..cover.clone() }, "other messages"),
        ] {
            assert!(!p.covers_exactly(&other), "{why}");
        }
        // A conversation that goes on past the summary is one it stands for, not exactly.
        assert_eq!(p.stands_for(&p.model, &p.shape, 14, |n| if n == 12 { p.prefix } else { [0; 32] }), Ok(()));
    }

    #[test]
    fn a_record_round_trips_and_a_damaged_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = PreparedStore::new(dir.path());
        assert_eq!(store.load("s-1"), None);
        store.save(&sample()).unwrap();
        assert_eq!(store.load("s-1"), Some(sample()));
        assert_eq!(store.load("s-2"), None, "another session's record is not found");
        let path = store.path("s-1");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        assert_eq!(store.load("s-1"), None, "cut");
        std::fs::write(&path, text.replace("\"covered\":12", "\"covered\":11")).unwrap();
        assert_eq!(store.load("s-1"), None, "edited");
        std::fs::write(&path, text.replace("\"version\":1", "\"version\":2")).unwrap();
        assert_eq!(store.load("s-1"), None, "another version");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(store.load("s-1"), Some(sample()));
    }
}
