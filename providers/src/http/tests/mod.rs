//! Tests of the shared HTTP client against wiremock and raw TCP servers.

mod bodies;
mod client;
mod headers;
mod policy;
mod retries;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde_json::json;
use url::Url;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::*;

/// Tiny delays so retry tests stay fast.
fn fast() -> HttpSettings {
    HttpSettings {
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        max_retries: 3,
        retry_initial_delay: Duration::from_millis(1),
        retry_max_delay: Duration::from_millis(5),
        ..HttpSettings::default()
    }
}

fn client(settings: HttpSettings) -> HttpClient {
    HttpClient::new(settings).unwrap()
}

fn url(server: &MockServer, path: &str) -> Url {
    Url::parse(&format!("{}{path}", server.uri())).unwrap()
}

async fn get(client: &HttpClient, url: Url) -> Result<JsonResponse, FetchError> {
    client.get_json(url, HeaderMap::new()).await
}

/// A server that answers each connection with the next raw response, then closes it.
/// Returns its base URL and the number of connections served.
fn raw_server(responses: Vec<Vec<u8>>) -> (Url, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    std::thread::spawn(move || {
        for response in responses {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(&response);
            let _ = stream.flush();
        }
    });
    (
        Url::parse(&format!("http://{address}/items")).unwrap(),
        served,
    )
}

fn ok_json(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
