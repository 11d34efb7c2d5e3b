//! A small JSON-RPC client over the LSP base protocol, for ctxd's own commands that
//! drive a daemon (`ctxd replay`) the way an editor would.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use anyhow::{Context, anyhow};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::transport::framing::{self, FrameReader};

type Pending = Arc<std::sync::Mutex<HashMap<i64, oneshot::Sender<Result<Value, Value>>>>>;

/// A connected client.
#[derive(Debug)]
pub struct RpcClient<W> {
    writer: Mutex<W>,
    next_id: AtomicI64,
    pending: Pending,
    /// Notifications from the server, in arrival order.
    pub notifications: Mutex<mpsc::UnboundedReceiver<(String, Value)>>,
}

impl<W: AsyncWrite + Unpin + Send> RpcClient<W> {
    /// Starts reading `reader` in the background and returns the client.
    pub fn new<R: AsyncRead + Unpin + Send + 'static>(reader: R, writer: W) -> RpcClient<W> {
        let pending: Pending = Arc::default();
        let (note_tx, note_rx) = mpsc::unbounded_channel();
        let reading = pending.clone();
        tokio::spawn(async move {
            let mut frames = FrameReader::new(reader, usize::MAX);
            while let Some(Ok(body)) = frames.next_frame().await {
                let Ok(message) = serde_json::from_str::<Value>(&body) else { continue };
                let id = message.get("id").and_then(Value::as_i64);
                match (id, message.get("method")) {
                    (_, Some(method)) => {
                        let params = message.get("params").cloned().unwrap_or(Value::Null);
                        let _ = note_tx.send((method.as_str().unwrap_or_default().to_owned(), params));
                    }
                    (Some(id), None) => {
                        let waiter = reading.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
                        if let Some(waiter) = waiter {
                            let result = match message.get("error") {
                                Some(error) => Err(error.clone()),
                                None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
                            };
                            let _ = waiter.send(result);
                        }
                    }
                    (None, None) => {}
                }
            }
        });
        RpcClient {
            writer: Mutex::new(writer),
            next_id: AtomicI64::new(1),
            pending,
            notifications: Mutex::new(note_rx),
        }
    }

    async fn send(&self, message: &Value) -> anyhow::Result<()> {
        let body = serde_json::to_vec(message)?;
        let mut writer = self.writer.lock().await;
        writer.write_all(&framing::encode(&body)).await?;
        writer.flush().await?;
        Ok(())
    }

    /// Sends a request and waits for its result; a JSON-RPC error becomes `Err`.
    pub async fn request(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, tx);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await?;
        match rx.await.context("the daemon closed the connection")? {
            Ok(result) => Ok(result),
            Err(error) => Err(anyhow!(
                "{method} failed: {}",
                error.get("message").and_then(Value::as_str).unwrap_or("unknown error")
            )),
        }
    }

    pub async fn notify(&self, method: &str, params: Value) -> anyhow::Result<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params})).await
    }
}
