//! The demo's upstream: a tiny HTTP server that echoes what reached it, so a person can see
//! which requests Envoy let through.

use std::convert::Infallible;
use std::time::Duration;

use anyhow::Result;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener) -> Result<()> {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(err) => {
                // E.g. out of file descriptors: transient, so keep serving.
                eprintln!("upstream: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let connection =
                http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(echo));
            if let Err(err) = connection.await {
                eprintln!("upstream: connection error: {err}");
            }
        });
    }
}

async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(echo_response(&request))
}

fn echo_response<B>(request: &Request<B>) -> Response<Full<Bytes>> {
    let api_key = request
        .headers()
        .get("x-api-key")
        .and_then(|value| value.to_str().ok());
    let body = serde_json::json!({
        "upstream": "sluice demo",
        "method": request.method().as_str(),
        "path": request.uri().path(),
        "x-api-key": api_key,
    });
    let mut response = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn echoes_method_path_and_api_key() {
        let request = Request::post("/api/hello?x=1")
            .header("x-api-key", "alice")
            .body(())
            .unwrap();
        let response = echo_response(&request);
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["method"], "POST");
        assert_eq!(json["path"], "/api/hello");
        assert_eq!(json["x-api-key"], "alice");
    }

    #[tokio::test]
    async fn a_missing_api_key_is_null() {
        let request = Request::get("/").body(()).unwrap();
        let body = echo_response(&request)
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(json["x-api-key"].is_null());
    }
}
