//! Streaming for the API adapters (OpenAI's Responses, Anthropic's Messages): server-sent events
//! with `event:` names, translated from the engine's events by a [`Translator`].
//!
//! Chat and text completions stream bare `data:` chunks (see `stream.rs`); the adapters' SDKs
//! dispatch on the event name as well, so each adapter only says what to send for each engine
//! event and this module drives the request. As in `stream.rs`, comment pings keep proxies from
//! closing a quiet connection, and dropping the stream (the client went away) cancels the
//! request at the engine's next step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use onebit_engine::Event;
use serde_json::Value as Json;

use crate::error::ApiError;
use crate::generate::Running;

/// Events waiting to go out, and whether the stream is over.
#[derive(Default)]
pub struct Out {
    queue: VecDeque<SseEvent>,
    over: bool,
}

impl Out {
    /// Queue `event: NAME` with `data:` the JSON.
    pub fn send(&mut self, name: &str, data: &Json) {
        self.queue.push_back(SseEvent::default().event(name).data(data.to_string()));
    }

    /// Nothing more goes out after what is queued.
    pub fn end(&mut self) {
        self.over = true;
    }
}

/// What an adapter sends for each moment of a request of one choice.
pub trait Translator: Send + 'static {
    /// Sent at once, before the engine says anything.
    fn start(&mut self, out: &mut Out);
    /// One event of the request; the translator ends the stream after `Done`.
    fn on_event(&mut self, running: &Running, ev: Event, out: &mut Out);
    /// The request failed after the stream began (the status line is already sent, so the
    /// error travels as an event).
    fn fail(&mut self, e: &ApiError, out: &mut Out);
}

/// The SSE response for a running request of one choice.
/// `ping`: the quiet time after which a comment ping goes out.
pub fn respond<T: Translator>(running: Running, mut translator: T, ping: Duration) -> Response {
    let mut out = Out::default();
    translator.start(&mut out);
    let events = stream::unfold((running, translator, out), |(mut running, mut t, mut out)| async move {
        loop {
            if let Some(ev) = out.queue.pop_front() {
                return Some((Ok::<_, Infallible>(ev), (running, t, out)));
            }
            if out.over {
                return None;
            }
            match running.next().await {
                Some((_, Event::Done(Err(e)))) => {
                    let e = ApiError::from(e);
                    tracing::warn!(id = %running.id(), status = e.status.as_u16(), "stream failed: {}", e.message);
                    t.fail(&e, &mut out);
                    out.end();
                }
                Some((_, ev)) => t.on_event(&running, ev, &mut out),
                // The engine dropped the request without a last word.
                None => {
                    t.fail(&ApiError::internal("the engine stopped before the answer was complete"), &mut out);
                    out.end();
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(ping).text("ping")).into_response()
}
