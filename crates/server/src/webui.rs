//! The chat page at `/`: one HTML file (HTML, CSS and JavaScript, no build step, no CDN)
//! compiled into the binary.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../assets/index.html");

pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], INDEX).into_response()
}
