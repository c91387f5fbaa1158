//! A tiny scripted HTTP/1.1 API on loopback, for what wiremock cannot play: connections
//! dropped without an answer, bodies cut short of their `Content-Length`, and answers held
//! back until the test opens a gate.
//!
//! Every request is answered by an async script, which sees the request and how many
//! requests with the same path and query came before it (so "the first two attempts at
//! page 3 fail" is easy to say). It runs on its own thread and runtime, so a test that
//! blocks (waiting for a child process) never stalls it. One request per connection
//! (`Connection: close`).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Path and query, as sent.
    pub target: String,
    /// Earlier requests with the same target (0 for the first).
    pub attempt: usize,
}

impl Seen {
    /// A query parameter's (undecoded) value.
    pub fn query(&self, name: &str) -> Option<String> {
        let query = self.target.split_once('?')?.1;
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key == name).then(|| value.to_string())
        })
    }
}

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A whole answer.
    Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Close the connection without answering: the client sees it closed before any
    /// answer came.
    Drop,
    /// The status line and headers with a `Content-Length` of the whole body, then only
    /// `sent` bytes of it, then close: a body cut short in transit.
    CutShort {
        status: u16,
        body: Vec<u8>,
        sent: usize,
    },
    /// Wait, then do the inner reply (a slow answer; the client may time out first).
    After(Duration, Box<Reply>),
}

impl Reply {
    /// 200 with a JSON body.
    pub fn json(body: &serde_json::Value) -> Reply {
        Reply::status_json(200, body)
    }

    pub fn status_json(status: u16, body: &serde_json::Value) -> Reply {
        Reply::Answer {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
        }
    }

    /// A status with a plain-text body.
    pub fn status(status: u16, text: &str) -> Reply {
        Reply::Answer {
            status,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: text.as_bytes().to_vec(),
        }
    }

    /// 200 with these exact bytes as an `application/json` body.
    pub fn raw_json(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::Answer {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: bytes.into(),
        }
    }

    /// Adds a header to an `Answer` (other replies are returned unchanged).
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Answer { headers, .. } = &mut self {
            headers.push((name.to_string(), value.to_string()));
        }
        self
    }

    pub fn after(self, delay: Duration) -> Reply {
        Reply::After(delay, Box::new(self))
    }
}

type Script =
    Arc<dyn Fn(Seen) -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync + 'static>;

/// A running scripted API; stops when dropped.
pub struct ScriptedApi {
    address: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl ScriptedApi {
    /// Starts a server whose every request is answered by `script`.
    pub fn start<F, Fut>(script: F) -> ScriptedApi
    where
        F: Fn(Seen) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        let script: Script = Arc::new(move |seen| Box::pin(script(seen)));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, address) = std::sync::mpsc::channel();
        let log = seen.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("scripted API runtime");
            runtime.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                ready
                    .send(listener.local_addr().expect("address"))
                    .expect("report address");
                let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let (script, log, counts) = (script.clone(), log.clone(), counts.clone());
                        tokio::spawn(async move {
                            let _ = serve_one(stream, script, log, counts).await;
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        });
        ScriptedApi {
            address: address.recv().expect("scripted API started"),
            seen,
            stop: Some(stop),
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn uri(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ScriptedApi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve_one(
    mut stream: TcpStream,
    script: Script,
    log: Arc<Mutex<Vec<Seen>>>,
    counts: Arc<Mutex<HashMap<String, usize>>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let request_line = text.split("\r\n").next().unwrap_or("");
    let target = request_line.split(' ').nth(1).unwrap_or("").to_string();
    let attempt = {
        let mut counts = counts.lock().unwrap();
        let count = counts.entry(target.clone()).or_insert(0);
        *count += 1;
        *count - 1
    };
    let seen = Seen { target, attempt };
    log.lock().unwrap().push(seen.clone());
    let mut reply = script(seen).await;
    loop {
        match reply {
            Reply::After(delay, inner) => {
                tokio::time::sleep(delay).await;
                reply = *inner;
            }
            Reply::Drop => return Ok(()),
            Reply::Answer {
                status,
                headers,
                body,
            } => {
                stream
                    .write_all(&head_bytes(status, &headers, body.len()))
                    .await?;
                stream.write_all(&body).await?;
                stream.shutdown().await?;
                return Ok(());
            }
            Reply::CutShort { status, body, sent } => {
                stream
                    .write_all(&head_bytes(status, &[], body.len()))
                    .await?;
                stream.write_all(&body[..sent.min(body.len())]).await?;
                stream.flush().await?;
                return Ok(());
            }
        }
    }
}

fn head_bytes(status: u16, headers: &[(String, String)], length: usize) -> Vec<u8> {
    let mut head =
        format!("HTTP/1.1 {status} Scripted\r\ncontent-length: {length}\r\nconnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}
