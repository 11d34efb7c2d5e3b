//! A local stand-in for a provider's Messages endpoint, for tests that compact over
//! real HTTP: each request is read whole, recorded (headers and body) and answered by a
//! function of its body.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a failed step is a failed test

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// The requests a stub server has seen: header lines and body of each.
pub type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Serves every request with `respond(request_body) -> (status, body)`; returns the port
/// and the requests seen. A 3xx status sends its body as the `Location`.
pub fn serve(respond: fn(&str) -> (u16, String)) -> (u16, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut stream) = stream else { continue };
            let (headers, body) = crate::read_http_request(&mut BufReader::new(stream.try_clone().unwrap()));
            let body = String::from_utf8_lossy(&body).into_owned();
            let (status, reply) = respond(&body);
            log.lock().unwrap().push((headers, body));
            let kind = if status == 200 { "text/event-stream" } else { "application/json" };
            let (location, reply) = if (300..400).contains(&status) {
                (format!("Location: {reply}\r\n"), String::new())
            } else {
                (String::new(), reply)
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\n{location}Content-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    (port, seen)
}

/// A complete Messages stream whose one text block is `text` (none when empty).
pub fn sse_text(text: &str) -> (u16, String) {
    let block = (!text.is_empty()).then(|| {
        [
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
            json!({"type": "content_block_stop", "index": 0}),
        ]
    });
    sse_events(block.into_iter().flatten().collect(), "end_turn")
}

/// A complete Messages stream: `message_start`, `blocks`, the stop reason, `message_stop`.
pub fn sse_events(blocks: Vec<Value>, stop_reason: &str) -> (u16, String) {
    let mut events = vec![
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "usage": {"input_tokens": 100, "output_tokens": 1}}}),
    ];
    events.extend(blocks);
    events
        .push(json!({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 40}}));
    events.push(json!({"type": "message_stop"}));
    let body = events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    (200, body)
}
