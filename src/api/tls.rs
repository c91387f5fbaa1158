//! The API's listener when `[api] tls_cert` is set: TCP connections handed to
//! `axum::serve` once their TLS handshake is done, so that shutdown, timeouts and limits
//! are the plain listener's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Accepts TCP connections and shakes hands on each in a task of its own, so a slow or
/// silent client holds up no other; [`axum::serve::Listener::accept`] yields the
/// connections whose handshake succeeded. Dropping it closes the socket and abandons the
/// handshakes under way.
pub(super) struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    /// The longest a handshake may take (the API's `request_timeout`).
    handshake_timeout: Duration,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    pub(super) fn new(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
        handshake_timeout: Duration,
    ) -> TlsListener {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshake_timeout,
            handshakes: JoinSet::new(),
        }
    }

    fn shake_hands(&mut self, stream: TcpStream, peer: SocketAddr) {
        let acceptor = self.acceptor.clone();
        let timeout = self.handshake_timeout;
        self.handshakes.spawn(async move {
            match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => Some((tls, peer)),
                // A client's mistake (plain HTTP, an untrusted certificate, a port scan),
                // not the server's: said at debug.
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "A TLS handshake failed.");
                    None
                }
                Err(_) => {
                    tracing::debug!(%peer, timeout_ms = timeout.as_millis(), "A TLS handshake timed out.");
                    None
                }
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, peer)) => self.shake_hands(stream, peer),
                    Err(error) => accept_failed(error).await,
                },
                Some(done) = self.handshakes.join_next() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// What axum's own TCP listener does on an accept error: a connection that went away
/// before it was accepted is skipped; anything else (such as too many open files) is
/// logged and waited out for a second.
async fn accept_failed(error: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "Accepting an API connection failed.");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
