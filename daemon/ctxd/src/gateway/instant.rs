//! Instant compaction: a Claude Code compaction request answered at once from the
//! summary prepared for its session ([`super::prepare`]), or forwarded unchanged with
//! one log line saying why not.
//!
//! With preparation on, a Messages request's body is read whole before it goes
//! upstream (it must be, to know whether the gateway answers it): an ordinary turn is
//! then forwarded as read and kept as the session's newest request; a compaction
//! request is answered when a prepared summary stands for it (same session, model,
//! system and tools, and its messages start with exactly the messages the summary
//! covers; those after them are folded in offline), else forwarded. Reading whole is
//! bounded: a body of unknown length, or one that would take the bytes being read past
//! [`MAX_READING_BYTES`], is streamed through as before and not looked at. A compaction
//! request that comes while its session's preparation runs waits for it (at most
//! [`HOLD_FOR_PREPARATION`]) rather than asking the model for the same summary twice.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use ctxd_core::gateway::conversation::{self, CompactionForm, PrefixHash};
use ctxd_core::gateway::{RequestScan, instant as answer};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{self, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Response, StatusCode};

use super::Gateway;
use super::body::GatewayBody;
use super::prepare::{InFlight, Newest, Preparer};
use super::prepared::Prepared;

/// Request bytes being read whole at once, all requests together.
pub const MAX_READING_BYTES: usize = 256 << 20;
/// How long a compaction request waits for its session's running preparation before
/// it is forwarded (a model writes a summary in seconds to minutes).
const HOLD_FOR_PREPARATION: std::time::Duration = std::time::Duration::from_secs(180);

/// A request body on its way upstream: as it streams in, or read whole already.
pub enum Inbound {
    Streaming(hyper::body::Incoming),
    Read(Option<Bytes>),
}

impl Body for Inbound {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Inbound::Streaming(incoming) => Pin::new(incoming).poll_frame(cx),
            Inbound::Read(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Inbound::Streaming(incoming) => incoming.is_end_stream(),
            Inbound::Read(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Inbound::Streaming(incoming) => incoming.size_hint(),
            Inbound::Read(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

/// What became of a Messages request.
pub enum Intercepted {
    /// The gateway answered it.
    Answered(Response<GatewayBody>),
    /// It goes upstream: its body, and its session's in-flight mark.
    Forward(Inbound, Option<InFlight>),
}

/// Reads a Messages request and answers it or lets it go on.
pub async fn intercept(
    gateway: &Gateway,
    preparer: &Arc<Preparer>,
    parts: &Parts,
    incoming: hyper::body::Incoming,
    target: &str,
    header_session: Option<String>,
) -> Intercepted {
    let Some(length) = incoming.size_hint().exact().and_then(|n| usize::try_from(n).ok()) else {
        return Intercepted::Forward(Inbound::Streaming(incoming), None);
    };
    let permits = u32::try_from(length.div_ceil(1024)).unwrap_or(u32::MAX);
    let Ok(_reading) = gateway.reading.clone().try_acquire_many_owned(permits) else {
        tracing::debug!(length, "gateway: too many bytes being read; a request streamed through unread");
        return Intercepted::Forward(Inbound::Streaming(incoming), None);
    };
    let body = match incoming.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            // The client went away or sent a broken body: nothing to forward.
            tracing::info!(error = %e, "gateway: a request body broke off; nothing forwarded");
            return Intercepted::Answered(super::forward::error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "ctxd gateway: the request body broke off",
            ));
        }
    };
    let session = header_session.or_else(|| {
        let mut scan = RequestScan::default();
        scan.feed(&body);
        scan.into_facts().session_id
    });
    let looks_like_compaction = memchr::memmem::find(&body, conversation::INSTRUCTION_OPENING.as_bytes()).is_some();
    let forward = |why: &str, session: Option<&str>, guard: Option<InFlight>, body: Bytes| {
        if looks_like_compaction {
            tracing::info!(session = session.unwrap_or("-"), "gateway: compaction request forwarded: {why}");
        }
        Intercepted::Forward(Inbound::Read(Some(body)), guard)
    };
    let Some(session) = session else { return forward("it names no session", None, None, body) };
    // An ordinary turn costs one scan of the body and one parse of its last message; a
    // compaction request is read whole, off the runtime's workers.
    let glance = conversation::read(&body).map(|c| (c.asks_for_summary(), c.has_tools, c.model));
    let (asks, has_tools, model) = match glance {
        Ok(glance) => glance,
        Err(e) => {
            let guard = preparer.sent(&session, None);
            return forward(&format!("not read as a conversation ({e})"), Some(&session), Some(guard), body);
        }
    };
    if !asks {
        if !has_tools {
            // A side request (title, classification): not the conversation to fork.
            let guard = preparer.sent(&session, None);
            return Intercepted::Forward(Inbound::Read(Some(body)), Some(guard));
        }
        let newest = Newest {
            body: body.clone(),
            headers: super::forward::forwardable(&parts.headers, true),
            target: target.to_owned(),
            model,
        };
        let guard = preparer.sent(&session, Some(newest));
        return Intercepted::Forward(Inbound::Read(Some(body)), Some(guard));
    }
    preparer.compacting(&session);
    let (mut prepared, mut preparing) = preparer.prepared(&session);
    if preparing {
        // The running preparation is the summary this request asks for, and nearer done
        // than a new call would be: wait for it rather than pay for the summary twice.
        tracing::info!(session = %session, "gateway: compaction request held until its preparation ends");
        if preparer.preparation_ended(&session, HOLD_FOR_PREPARATION).await {
            (prepared, preparing) = preparer.prepared(&session);
        }
    }
    let refuse = |why: String| {
        let guard = preparer.sent(&session, None);
        forward(&why, Some(&session), Some(guard), body.clone())
    };
    let Some(prepared) = prepared else {
        return refuse(
            if preparing {
                "its preparation was still running after the hold"
            } else {
                "nothing prepared for the session"
            }
            .into(),
        );
    };
    let decided = {
        let (body, prepared, env) = (body.clone(), prepared.clone(), gateway.config.env.clone());
        tokio::task::spawn_blocking(move || decide(&body, &prepared, env.as_deref())).await
    };
    let (text, model, delta, form) = match decided {
        Ok(Ok(answer)) => answer,
        Ok(Err(why)) => return refuse(why),
        Err(e) => return refuse(format!("its reading failed ({e})")),
    };
    let id = format!("msg_ctxd_{}", uuid::Uuid::new_v4().simple());
    let stream = answer::event_stream(&id, &model, &text, &prepared.usage);
    preparer.answered_instantly(&session, &prepared, &text);
    tracing::info!(
        session = %session,
        covered = prepared.covered,
        delta,
        form = ?form,
        "gateway: compaction answered from the prepared summary"
    );
    let mut response = Response::new(GatewayBody::full(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&id) {
        headers.insert("x-ctxd-instant-compaction", value);
    }
    Intercepted::Answered(response)
}

/// Whether `prepared` stands for the compaction request `body`, and if so the answer's
/// text, the model, the number of messages past the prepared prefix and the form; else
/// why not.
fn decide(
    body: &[u8],
    prepared: &Prepared,
    env: Option<&crate::process_env::ProcessEnv>,
) -> Result<(String, String, usize, CompactionForm), String> {
    let conversation = conversation::read(body).map_err(|e| format!("not read as a conversation ({e})"))?;
    let (model, stream) = (conversation.model.clone(), conversation.stream);
    let shape = conversation.shape().map_err(|e| format!("not read as a conversation ({e})"))?;
    let values = conversation.values().map_err(|e| format!("not read as a conversation ({e})"))?;
    let ask = conversation::compaction_ask(values).ok_or("its instruction is not where Claude Code puts it")?;
    if !stream {
        return Err("it does not ask for a stream".into());
    }
    // A summary written without the user's focus is not the one asked for. (The focus is
    // the user's text: its length goes to the log, not its words.)
    if let Some(focus) = &ask.focus {
        return Err(format!(
            "it asks for a focus ({} characters) the prepared summary was not written for",
            focus.len()
        ));
    }
    prepared.stands_for(&model, &shape, ask.covered.len(), |n| PrefixHash::of(&ask.covered, n).hash())?;
    let delta = &ask.covered[prepared.covered..];
    // The history tools, when `ctxd mcp` is configured for the project the program
    // names as its working directory.
    let project = answer::working_directory(body).map(PathBuf::from);
    let tools = env.and_then(|env| crate::mcp_config::history_tools(project.as_deref(), env));
    let text =
        answer::answer_text(&prepared.reply, prepared.covered, delta, tools.as_ref()).map_err(|e| e.to_string())?;
    Ok((text, model, delta.len(), ask.form))
}
