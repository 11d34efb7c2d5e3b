//! The two bodies of a forwarded exchange, each passed on frame by frame as it
//! arrives, and read on the way by the core's bounded scanners.
//!
//! [`UpBody`] carries the client's request body to the upstream: it stops a body past
//! the size limit (the client then gets 413) and, for a Messages request, reads the
//! session, model and cache markers ([`RequestScan`]). [`DownBody`] carries the
//! upstream's answer to the client: for a Messages answer it reads the usage
//! ([`AnswerScan`], through a streaming gzip or deflate decoder when the answer is
//! compressed) and, after the last byte, hands the figures to the live registry.
//! Neither keeps more than the frame in hand and the scanners' bounded state. Dropping
//! [`DownBody`] (the client went away) drops the upstream response with it, which
//! closes that connection: the upstream request is cancelled.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use ctxd_core::gateway::{AnswerKind, AnswerScan, RequestFacts, RequestScan};
use hyper::body::{Body, Frame, SizeHint};

use super::live::{Live, LiveFigures};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the request side learned, for the answer side.
#[derive(Debug, Default)]
pub struct Exchange {
    state: Mutex<ExchangeState>,
}

#[derive(Debug, Default)]
struct ExchangeState {
    facts: RequestFacts,
    /// When the request body's last byte was handed on.
    sent_at: Option<SystemTime>,
    too_large: bool,
}

impl Exchange {
    fn state(&self) -> std::sync::MutexGuard<'_, ExchangeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request body was stopped at the size limit.
    pub fn too_large(&self) -> bool {
        self.state().too_large
    }
}

/// The request body went past the limit.
#[derive(Debug, thiserror::Error)]
#[error("the request body is larger than {limit} bytes")]
pub struct TooLarge {
    pub limit: u64,
}

/// Told a request's facts once its last byte has passed.
pub type OnRequestEnd = Box<dyn FnOnce(&RequestFacts) + Send + Sync>;

/// The client's request body on its way upstream.
pub struct UpBody {
    inner: Mutex<super::instant::Inbound>,
    scan: Option<RequestScan>,
    seen: u64,
    limit: u64,
    /// The declared length: the client of the upstream may stop polling once it is sent.
    declared: Option<u64>,
    exchange: Arc<Exchange>,
    /// Called once with the request's facts when its last byte has passed.
    on_end: Option<OnRequestEnd>,
}

impl UpBody {
    /// `scan`: read the body as a Messages request; `on_end` runs when it has passed.
    pub fn new(
        inner: super::instant::Inbound,
        scan: bool,
        limit: u64,
        exchange: Arc<Exchange>,
        on_end: OnRequestEnd,
    ) -> UpBody {
        let declared = inner.size_hint().exact();
        UpBody {
            declared,
            inner: Mutex::new(inner),
            scan: scan.then(RequestScan::default),
            seen: 0,
            limit,
            exchange,
            on_end: Some(on_end),
        }
    }

    fn ended(&mut self) {
        if self.on_end.is_none() {
            return;
        }
        let facts = self.scan.take().map(RequestScan::into_facts).unwrap_or_default();
        if let Some(on_end) = self.on_end.take() {
            on_end(&facts);
        }
        let mut state = self.exchange.state();
        state.facts = facts;
        state.sent_at = Some(SystemTime::now());
    }
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = {
            let mut inner = this.inner.lock().unwrap_or_else(PoisonError::into_inner);
            Pin::new(&mut *inner).poll_frame(cx)
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if this.seen > this.limit {
                        this.exchange.state().too_large = true;
                        this.scan = None;
                        return Poll::Ready(Some(Err(Box::new(TooLarge { limit: this.limit }))));
                    }
                    if let Some(scan) = &mut this.scan {
                        scan.feed(data);
                    }
                    if this.declared == Some(this.seen) {
                        this.ended();
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.ended();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).size_hint()
    }
}

/// What is needed to record an answer's figures once it has passed.
pub struct Recorder {
    pub live: LiveFigures,
    pub exchange: Arc<Exchange>,
    /// The session named by the request's header, if valid.
    pub header_session: Option<String>,
    /// The cache's lifetime when `CTXD_CACHE_TTL_SECONDS` sets it (tests).
    pub cache_ttl_seconds: Option<u64>,
}

impl Recorder {
    fn record(self, scan: AnswerScan) {
        let answer = scan.into_facts();
        let (facts, sent_at) = {
            let state = self.exchange.state();
            (state.facts.clone(), state.sent_at)
        };
        let Some(session_id) = self.header_session.or_else(|| facts.session_id.clone()) else { return };
        let Some(usage) = answer.usage else {
            tracing::debug!(session = %session_id, "an answer without usage; figures unchanged");
            return;
        };
        let answered_at = SystemTime::now();
        let figures = ctxd_proto::GatewaySession {
            session_id,
            model: answer.model.or(facts.model.clone()).unwrap_or_default(),
            input_tokens: usage.input_tokens,
            cache_read_input_tokens: usage.cache_read_input_tokens,
            cache_creation_input_tokens: usage.cache_creation_input_tokens,
            output_tokens: usage.output_tokens,
            sent_at: rfc3339(sent_at.unwrap_or(answered_at)),
            answered_at: rfc3339(answered_at),
            cache_ttl_seconds: self.cache_ttl_seconds.unwrap_or_else(|| facts.cache_ttl_seconds()),
            requests: 0,
            summary_ready: false,
        };
        tracing::debug!(session = %figures.session_id, model = %figures.model, "answer figures recorded");
        self.live.answered(Live { figures, message_id: answer.message_id });
    }
}

fn rfc3339(at: SystemTime) -> String {
    let ms = at.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    ctxd_core::view::format_rfc3339_ms(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// How the answer's bytes are encoded (`Content-Encoding`), as far as its usage can be
/// read: the client always gets the bytes as they came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
    /// HTTP's `deflate`: zlib-wrapped.
    Deflate,
}

impl Coding {
    /// `None` for a coding ctxd cannot read (`br`, `zstd`, several layered).
    pub fn from_header(value: Option<&[u8]>) -> Option<Coding> {
        let value = value.map(|v| String::from_utf8_lossy(v).trim().to_ascii_lowercase());
        match value.as_deref() {
            None | Some("" | "identity") => Some(Coding::Identity),
            Some("gzip" | "x-gzip") => Some(Coding::Gzip),
            Some("deflate") => Some(Coding::Deflate),
            Some(_) => None,
        }
    }
}

/// The decoded bytes go straight to the scanner: nothing decoded is kept.
struct ScanSink(AnswerScan);

impl std::io::Write for ScanSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.feed(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The answer's reader: the scanner, behind a streaming decoder when it is compressed
/// (the decoder holds its window, 32 KiB, and no more).
enum Reader {
    Plain(Box<AnswerScan>),
    Gzip(Box<flate2::write::GzDecoder<ScanSink>>),
    Deflate(Box<flate2::write::ZlibDecoder<ScanSink>>),
}

impl Reader {
    fn new(kind: AnswerKind, coding: Coding) -> Reader {
        let scan = AnswerScan::new(kind);
        match coding {
            Coding::Identity => Reader::Plain(Box::new(scan)),
            Coding::Gzip => Reader::Gzip(Box::new(flate2::write::GzDecoder::new(ScanSink(scan)))),
            Coding::Deflate => Reader::Deflate(Box::new(flate2::write::ZlibDecoder::new(ScanSink(scan)))),
        }
    }

    /// Reads the next bytes; `false` when they do not decode (reading stops).
    fn feed(&mut self, bytes: &[u8]) -> bool {
        use std::io::Write;
        match self {
            Reader::Plain(scan) => {
                scan.feed(bytes);
                true
            }
            Reader::Gzip(decoder) => decoder.write_all(bytes).is_ok(),
            Reader::Deflate(decoder) => decoder.write_all(bytes).is_ok(),
        }
    }

    fn finish(self) -> Option<AnswerScan> {
        match self {
            Reader::Plain(scan) => Some(*scan),
            Reader::Gzip(decoder) => decoder.finish().ok().map(|sink| sink.0),
            Reader::Deflate(decoder) => decoder.finish().ok().map(|sink| sink.0),
        }
    }
}

/// The upstream's answer on its way to the client.
pub struct DownBody {
    inner: reqwest::Body,
    scan: Option<(Reader, Recorder)>,
    /// Bytes still to come when the answer declared its length: the server may stop
    /// polling once they are written, so the last byte is known by count.
    remaining: Option<u64>,
    /// Held until the answer has passed: the gateway's limit on streams in flight.
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// The session's in-flight mark (instant compaction), held as long.
    _in_flight: Option<super::prepare::InFlight>,
}

impl DownBody {
    /// `read`: the answer's kind and coding and where its figures go, for a Messages
    /// answer that can be read (a success in a coding ctxd reads).
    pub fn new(
        inner: reqwest::Body,
        read: Option<(AnswerKind, Coding, Recorder)>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> DownBody {
        let remaining = inner.size_hint().exact();
        DownBody {
            inner,
            scan: read.map(|(kind, coding, recorder)| (Reader::new(kind, coding), recorder)),
            remaining,
            _permit: permit,
            _in_flight: None,
        }
    }

    /// Holds the session's in-flight mark until the answer has passed.
    pub fn hold(&mut self, in_flight: Option<super::prepare::InFlight>) {
        self._in_flight = in_flight;
    }

    /// The answer has passed whole: its figures go to the registry.
    fn finish(&mut self) {
        if let Some((reader, recorder)) = self.scan.take() {
            match reader.finish() {
                Some(scan) => recorder.record(scan),
                None => tracing::debug!("a compressed answer did not decode; its figures are not read"),
            }
        }
    }
}

impl Body for DownBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some((reader, _))) = (frame.data_ref(), &mut this.scan) {
                    if !reader.feed(data) {
                        tracing::debug!("a compressed answer did not decode; its figures are not read");
                        this.scan = None;
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    if let Some(remaining) = &mut this.remaining {
                        *remaining = remaining.saturating_sub(data.len() as u64);
                        if *remaining == 0 {
                            this.finish();
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                // A cut answer: the client sees it cut too; no figures from it.
                this.scan = None;
                let e = e.without_url();
                tracing::info!(error = %e, "the upstream's answer broke off; passed on as cut");
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What the gateway answers with: its own small bodies, or an upstream answer.
pub enum GatewayBody {
    Full(Option<Bytes>),
    Down(Box<DownBody>),
}

impl GatewayBody {
    pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
        GatewayBody::Full(Some(bytes.into()))
    }
}

impl Body for GatewayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            GatewayBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            GatewayBody::Down(down) => Pin::new(&mut **down).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GatewayBody::Full(bytes) => bytes.is_none(),
            GatewayBody::Down(down) => down.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GatewayBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            GatewayBody::Full(None) => SizeHint::with_exact(0),
            GatewayBody::Down(down) => down.size_hint(),
        }
    }
}
