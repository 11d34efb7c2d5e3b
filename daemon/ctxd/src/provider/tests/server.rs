//! A one-connection HTTP server that plays a script: bytes, pauses, a cut, or silence.
//! wiremock answers with whole bodies; the failures that matter for streaming happen
//! between the bytes of a body.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

#[derive(Debug, Clone)]
pub enum Step {
    Send(Vec<u8>),
    Pause(Duration),
    /// Close the connection now.
    Cut,
    /// Send nothing more and keep the connection open until the client goes away.
    Hang,
}

pub struct Served {
    pub base: String,
    /// The request as received (head and body).
    pub request: oneshot::Receiver<String>,
    /// Fires when the client closed the connection (read returned end of file or an
    /// error) after the script ran or while it hung.
    pub client_closed: oneshot::Receiver<()>,
}

pub async fn serve(steps: Vec<Step>) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (request_tx, request) = oneshot::channel();
    let (closed_tx, client_closed) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        socket.set_nodelay(true).unwrap();
        let _ = request_tx.send(read_request(&mut socket).await);
        for step in steps {
            match step {
                Step::Send(bytes) => {
                    if socket.write_all(&bytes).await.is_err() {
                        return;
                    }
                    let _ = socket.flush().await;
                }
                Step::Pause(d) => tokio::time::sleep(d).await,
                Step::Cut => return,
                Step::Hang => break,
            }
        }
        let mut buf = [0u8; 1024];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = closed_tx.send(());
                    return;
                }
                Ok(_) => {}
            }
        }
    });
    Served { base: format!("http://{addr}"), request, client_closed }
}

/// Reads the head and a `content-length` body.
async fn read_request(socket: &mut tokio::net::TcpStream) -> String {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if data.len() >= end + 4 + length {
                break;
            }
        }
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&data).into_owned()
}

/// A streaming response head whose body runs until the connection closes.
pub fn head_until_close() -> Step {
    Step::Send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec())
}

/// A streaming response head with a chunked body.
pub fn head_chunked() -> Step {
    Step::Send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec())
}

/// One HTTP chunk carrying `data`.
pub fn chunk(data: &[u8]) -> Step {
    let mut bytes = format!("{:x}\r\n", data.len()).into_bytes();
    bytes.extend_from_slice(data);
    bytes.extend_from_slice(b"\r\n");
    Step::Send(bytes)
}

/// The end of a chunked body.
pub fn last_chunk() -> Step {
    Step::Send(b"0\r\n\r\n".to_vec())
}
