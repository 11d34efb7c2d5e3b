//! Params in, answers out: each request's params are decoded once, from the frame's
//! text, and its answer is encoded once, straight from the handler's typed result into
//! the JSON-RPC response body. Errors become JSON-RPC errors here too ([`rpc_error`]).
//!
//! [`Table`] is how the server's table pairs a method's type with its handler: the
//! handler's params and result must be the ones the type names, so a wrong pair does
//! not compile.

use std::future::Future;
use std::sync::Arc;

use ctxd_core::compact::UndoError;
use ctxd_proto::{self as proto, Request, error_codes};
use futures::FutureExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tower_lsp_server::jsonrpc::{Error, ErrorCode, Id, Response};

use super::Backend;
use crate::session::SessionError;
use crate::store::StoreError;
use crate::transport::{Answer, Reply, Routed};

pub type Result<T> = std::result::Result<T, Error>;

/// A handler's result as it goes out: how large a buffer to encode it into, and what to
/// do once it is encoded (most results: nothing).
pub trait Outgoing: serde::Serialize + Send + 'static {
    /// Called with the encoded answer's length.
    fn encoded(&self, _bytes: usize) {}
}

/// A type that reads or writes as `T` on the wire: `T` itself, or a daemon type made
/// for speed (params borrowed from the frame, an answer encoded from text) that a test
/// shows to be the same JSON.
pub trait Wire<T> {}

impl<T> Wire<T> for T {}

/// A handler of request `R` taking params `P`: a function of the backend and the params
/// whose future answers with what `R` answers.
pub trait Handler<'a, R: Request, P> {
    /// The reply to request `id`, its params decoded from `params` (checked to be
    /// strict JSON first when `strict`), its answer encoded into `capacity` bytes.
    fn reply(self, call: Call<'a>, strict: bool, capacity: fn(&Self::Answer) -> usize) -> Reply;
    type Answer;
}

impl<'a, R, P, O, F, H> Handler<'a, R, P> for H
where
    R: Request,
    H: FnOnce(Arc<Backend>, P) -> F,
    P: Deserialize<'a> + Wire<R::Params>,
    F: Future<Output = Result<O>> + Send + 'static,
    O: Outgoing + Wire<R::Result>,
{
    type Answer = O;

    fn reply(self, call: Call<'a>, strict: bool, capacity: fn(&O) -> usize) -> Reply {
        let Call { backend, id, params, .. } = call;
        if strict {
            request(backend, id, params, self, capacity)
        } else {
            request_unchecked(backend, id, params, self, capacity)
        }
    }
}

/// A request on its way through the [`Table`].
pub struct Call<'a> {
    backend: &'a Arc<Backend>,
    id: Id,
    method: &'a str,
    params: Option<&'a RawValue>,
}

/// The `ctx/` table: each row names a method by its type and gives its handler; the
/// first row whose method the request names answers it. A table made by
/// [`Table::listing`] answers nothing and lists the methods of its rows instead.
pub struct Table<'a> {
    /// The request, until a row takes it.
    call: Option<Call<'a>>,
    routed: Option<Routed>,
    /// Set when the table lists its rows.
    listed: Option<Vec<&'static str>>,
}

impl<'a> Table<'a> {
    pub fn new(backend: &'a Arc<Backend>, id: Id, method: &'a str, params: Option<&'a RawValue>) -> Self {
        Table { call: Some(Call { backend, id, method, params }), routed: None, listed: None }
    }

    /// A table that answers nothing and records the method of each row.
    #[cfg(test)]
    pub fn listing() -> Self {
        Table { call: None, routed: None, listed: Some(Vec::new()) }
    }

    /// The methods of the rows, in order ([`Table::listing`]).
    #[cfg(test)]
    pub fn listed(self) -> Vec<&'static str> {
        self.listed.unwrap_or_default()
    }

    /// The request, when it names `R` and no row took it yet.
    fn take<R: Request>(&mut self) -> Option<Call<'a>> {
        if let Some(listed) = &mut self.listed {
            listed.push(R::METHOD);
        }
        match &self.call {
            Some(call) if call.method == R::METHOD => self.call.take(),
            _ => None,
        }
    }

    /// Request `R`, answered by `handler`; `$/cancelRequest` may stop it.
    pub fn on<R: Request>(self, handler: impl Handler<'a, R, R::Params>) -> Self {
        self.on_sized::<R, _>(handler, small)
    }

    /// [`Table::on`], with the buffer its answer is encoded into sized by `capacity`.
    pub fn on_sized<R: Request, H: Handler<'a, R, R::Params>>(
        mut self,
        handler: H,
        capacity: fn(&H::Answer) -> usize,
    ) -> Self {
        if let Some(call) = self.take::<R>() {
            let reply = handler.reply(call, true, capacity);
            self.routed = Some(Routed::Reply { reply, cancellable: true, exclusive: false });
        }
        self
    }

    /// `ctx/append`: its params read borrowed from the frame, each record checked as it
    /// is admitted (not the whole params first), and stored whether or not its answer
    /// is awaited (never answered "cancelled").
    pub fn on_append(
        mut self,
        handler: impl Handler<'a, proto::request::Append, super::handlers::AppendParams<'a>>,
    ) -> Self {
        if let Some(call) = self.take::<proto::request::Append>() {
            let reply = handler.reply(call, false, small);
            self.routed = Some(Routed::Reply { reply, cancellable: false, exclusive: false });
        }
        self
    }

    /// The routed request: a row's reply, nothing for an LSP extension ctxd does not
    /// know (`$/…`, even as a request), else "method not found".
    pub fn finish(self) -> Routed {
        if let Some(routed) = self.routed {
            return routed;
        }
        let Some(Call { id, method, .. }) = self.call else { return Routed::Nothing };
        if method.starts_with("$/") {
            return Routed::Nothing;
        }
        let mut error = Error::method_not_found();
        error.message = format!("unknown method: {method}").into();
        error.data = Some(method.into());
        Routed::Reply { reply: refuse(id, error), cancellable: true, exclusive: false }
    }
}

/// The buffer most answers need (counts, usage, a few strings): one allocation.
pub fn small<R>(_: &R) -> usize {
    1024
}

/// A request whose params are checked to be strict JSON, then decoded into `P`, then
/// handed to `handler`, whose future becomes the reply.
pub fn request<'a, P, R, F>(
    backend: &Arc<Backend>,
    id: Id,
    params: Option<&'a RawValue>,
    handler: impl FnOnce(Arc<Backend>, P) -> F,
    capacity: fn(&R) -> usize,
) -> Reply
where
    P: Deserialize<'a>,
    R: Outgoing,
    F: Future<Output = Result<R>> + Send + 'static,
{
    if let Some(raw) = params
        && let Err(reason) = ctxd_core::admit::strict_json(raw.get())
    {
        return refuse(id, not_strict(reason));
    }
    request_unchecked(backend, id, params, handler, capacity)
}

/// [`request`] without the strict-JSON pass over the params, for a handler that checks
/// what it keeps itself (`ctx/append` checks each record as it admits it).
pub fn request_unchecked<'a, P, R, F>(
    backend: &Arc<Backend>,
    id: Id,
    params: Option<&'a RawValue>,
    handler: impl FnOnce(Arc<Backend>, P) -> F,
    capacity: fn(&R) -> usize,
) -> Reply
where
    P: Deserialize<'a>,
    R: Outgoing,
    F: Future<Output = Result<R>> + Send + 'static,
{
    let params = match decode::<P>(params) {
        Ok(params) => params,
        Err(e) => return refuse(id, e),
    };
    let reply = handler(backend.clone(), params);
    async move { Some(answer(id, reply.await, capacity)) }.boxed()
}

/// An error answered at once.
pub fn refuse(id: Id, error: Error) -> Reply {
    futures::future::ready(Some(Answer::Response(Response::from_error(id, error)))).boxed()
}

/// The answer to request `id`: the result encoded in one pass into a buffer of
/// `capacity(result)` bytes to start with, or the error.
pub fn answer<R: Outgoing>(id: Id, result: Result<R>, capacity: fn(&R) -> usize) -> Answer {
    let encoded = result.and_then(|r| {
        let body = crate::transport::encode_result(&id, &r, capacity(&r)).map_err(|e| internal(e.to_string()))?;
        r.encoded(body.len());
        Ok(body)
    });
    match encoded {
        Ok(body) => Answer::Encoded(body),
        Err(e) => Answer::Response(Response::from_error(id, e)),
    }
}

/// Typed params from a request's params text, or an invalid-params error that says where
/// they went wrong (`records[2].message: missing field \`role\``): serde alone names the
/// problem but not the field, which leaves a client guessing.
pub fn decode<'a, P: Deserialize<'a>>(params: Option<&'a RawValue>) -> Result<P> {
    let Some(raw) = params else { return Err(invalid_params("Missing params field".to_owned())) };
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let why = without_position(e.inner());
        invalid_params(if path == "." { why } else { format!("{path}: {why}") })
    })
}

/// serde_json's message without the " at line 1 column 42" it adds when reading text:
/// the params are one value in a frame, and the path says where.
pub fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.line() == 0 {
        return text;
    }
    let position = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&position).map_or(text.clone(), str::to_owned)
}

/// Params that are not strict JSON (an unpaired surrogate escape, a number no double
/// holds): refused whole, the same on every method.
pub fn not_strict(reason: String) -> Error {
    invalid_params(format!("{reason}; ctxd accepts strict JSON only; nothing was done"))
}

pub fn invalid_params(message: String) -> Error {
    let mut error = Error::invalid_params(message);
    error.data = None;
    error
}

/// Awaits an actor's answer to a command that can fail.
pub async fn answer_of<T>(rx: oneshot::Receiver<std::result::Result<T, SessionError>>, id: &str) -> Result<T> {
    match rx.await {
        Ok(result) => result.map_err(rpc_error),
        Err(_) => Err(rpc_error(SessionError::Closed(id.to_owned()))),
    }
}

pub fn with_code(code: i64, message: String) -> Error {
    let mut e = Error::new(ErrorCode::ServerError(code));
    e.message = message.into();
    e
}

pub fn internal(message: String) -> Error {
    with_code(error_codes::INTERNAL, message)
}

/// The one place session errors become JSON-RPC errors.
pub fn rpc_error(e: SessionError) -> Error {
    let message = e.to_string();
    match e {
        SessionError::NotOpen(_) | SessionError::UnknownSession(_) => with_code(error_codes::UNKNOWN_SESSION, message),
        SessionError::InvalidSessionId(_) | SessionError::InvalidParams(_) => invalid_params(message),
        SessionError::Store(_) => with_code(error_codes::STORE, message),
        SessionError::Closed(_) => with_code(error_codes::SESSION_CLOSED, message),
        SessionError::Internal(_) => internal(message),
        SessionError::Busy(_) => with_code(error_codes::BUSY, message),
        SessionError::Cancelled(_) => Error::request_cancelled(),
        SessionError::CompactFailed(_) => with_code(error_codes::COMPACT_FAILED, message),
        SessionError::CannotUndo(why) => {
            let reason = match why {
                UndoError::NothingToUndo => proto::CannotUndoReason::NothingToUndo,
                UndoError::NewTurnSince => proto::CannotUndoReason::NewTurnSince,
            };
            let mut e = with_code(error_codes::CANNOT_UNDO, message);
            e.data = serde_json::to_value(proto::CannotUndoData { reason }).ok();
            e
        }
    }
}

pub fn store_error(e: StoreError) -> Error {
    let code = match e {
        StoreError::Locked { .. } => error_codes::STORE_LOCKED,
        _ => error_codes::STORE,
    };
    with_code(code, e.to_string())
}

/// Results with nothing to do after encoding.
macro_rules! plain {
    ($($t:ty),* $(,)?) => { $(impl Outgoing for $t {})* };
}

plain!(
    (),
    serde_json::Value,
    ctxd_proto::OpenSessionResult,
    ctxd_proto::AppendResult,
    ctxd_proto::UsageResult,
    ctxd_proto::SetAutoCompactWindowResult,
    ctxd_proto::FileReadResult,
    ctxd_proto::ContextResult,
    ctxd_proto::CompactResult,
    ctxd_proto::UndoCompactResult,
    ctxd_proto::ClaudeCompactResult,
    ctxd_proto::ClaudeUndoResult,
    ctxd_proto::ReportProviderErrorResult,
    ctxd_proto::ClearResult,
    ctxd_proto::SnipResult,
    ctxd_proto::CollapseResult,
    ctxd_proto::ObserveResult,
    tower_lsp_server::ls_types::InitializeResult,
);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn an_invalid_param_is_named_by_its_path_without_a_text_position() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Fork {
            instruction: String,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Params {
            fork: Fork,
        }
        let params = raw(r#"{"fork": {"instruction": 7}}"#);
        let error = decode::<Params>(Some(params)).unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidParams);
        assert_eq!(error.message, "fork.instruction: invalid type: integer `7`, expected a string");
        assert_eq!(decode::<Params>(None).unwrap_err().message, "Missing params field");
    }
}
