//! A TCP proxy between a daemon and the test's database server, which can cut the
//! database off as a restart would: every open session is dropped and every new one is
//! accepted and closed at once, without a greeting, until it is restored. (A refused
//! connection would not do: sqlx keeps trying to connect for its whole acquire timeout,
//! which hides a short outage from the code above it.) The shared server itself is never
//! restarted: other tests use it.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct DbProxy {
    address: SocketAddr,
    up: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl DbProxy {
    /// Listens on a free local port and forwards to the server of `database_url`.
    pub async fn start(database_url: &str) -> DbProxy {
        let target = server_address(database_url);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bound");
        let address = listener.local_addr().expect("proxy address");
        let (up, watch_up) = watch::channel(true);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if !*watch_up.borrow() {
                    drop(client);
                    continue;
                }
                let (mut watch_up, target) = (watch_up.clone(), target.clone());
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target.as_str()).await else {
                        return;
                    };
                    let mut client = client;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = watch_up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        DbProxy { address, up, task }
    }

    /// `database_url` with its server's address replaced by the proxy's.
    pub fn url(&self, database_url: &str) -> String {
        database_url.replacen(&server_address(database_url), &self.address.to_string(), 1)
    }

    /// Drops every open session and closes each new one until [`DbProxy::restore`].
    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    pub fn restore(&self) {
        self.up.send_replace(true);
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `host:port` of a `postgres://` or `mysql://` URL: between the `@` (or the scheme) and
/// the next `/`.
fn server_address(database_url: &str) -> String {
    let rest = database_url
        .split_once("://")
        .map_or(database_url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_string()
}
