//! Streamed answers: the engine's events as server-sent events in OpenAI's chunk shapes, then
//! (with `stream_options.include_usage`) a chunk of usage with no choices, then `data: [DONE]`.
//! Comment pings keep proxies from closing the connection while a long prompt is computed.
//! Dropping the stream (the client went away) cancels the request at the engine's next step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use onebit_engine::{Completion, Event};
use serde_json::{Value as Json, json};

use crate::error::ApiError;
use crate::generate::{Running, finish_reason};
use crate::shapes::{Kind, Shape};

/// How often a comment ping goes out while nothing else does.
const PING: Duration = Duration::from_secs(5);

struct StreamState {
    running: Running,
    shape: Shape,
    include_usage: bool,
    /// Events ready to go out.
    out: VecDeque<SseEvent>,
    /// Per choice: text sent so far (bytes, for the legacy logprobs' offsets).
    sent: Vec<usize>,
    completions: Vec<Option<Completion>>,
    over: bool,
}

/// The SSE response for a running request.
pub fn respond(running: Running, shape: Shape, include_usage: bool) -> Response {
    let n = running.n_choices();
    let mut st = StreamState {
        running,
        shape,
        include_usage,
        out: VecDeque::new(),
        sent: vec![0; n],
        completions: (0..n).map(|_| None).collect(),
        over: false,
    };
    if st.shape.kind == Kind::Chat {
        for i in 0..n {
            let chunk = st.shape.role_chunk(i);
            st.push(&chunk);
        }
    }
    let events = stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(ev), st));
            }
            if st.over {
                return None;
            }
            match st.running.next().await {
                Some((i, ev)) => st.on_event(i, ev),
                None => st.end(),
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(PING).text("ping")).into_response()
}

impl StreamState {
    fn push(&mut self, v: &Json) {
        self.out.push_back(SseEvent::default().data(v.to_string()));
    }

    fn on_event(&mut self, i: usize, ev: Event) {
        let ready = match self.running.state.ready() {
            Ok(r) => r,
            Err(e) => return self.fail(e),
        };
        let tok = ready.engine.tokenizer();
        match ev {
            Event::Token { text, logprobs, .. } => {
                let lp = match (&logprobs, self.shape.logprobs) {
                    (Some(lp), true) => self.shape.logprobs_json(tok, std::slice::from_ref(lp), self.sent[i]),
                    _ => Json::Null,
                };
                if text.is_empty() && lp.is_null() {
                    return;
                }
                self.sent[i] += text.len();
                let chunk = self.shape.chunk(i, Some(&text), lp, None);
                self.push(&chunk);
            }
            Event::Text { text } => {
                self.sent[i] += text.len();
                let chunk = self.shape.chunk(i, Some(&text), Json::Null, None);
                self.push(&chunk);
            }
            Event::Prefilled { .. } => {}
            Event::Done(Ok(c)) => {
                let mut chunk = self.shape.chunk(i, None, Json::Null, Some(finish_reason(c.finish)));
                if self.shape.kind == Kind::Text {
                    chunk["choices"][0]["text"] = json!("");
                }
                self.completions[i] = Some(c);
                if self.completions.iter().all(Option::is_some) {
                    let done: Vec<&Completion> = self.completions.iter().flatten().collect();
                    let (usage, timings) = self.running.report(&done);
                    chunk["timings"] = timings;
                    self.push(&chunk);
                    if self.include_usage {
                        let mut last = self.shape.envelope(Vec::new());
                        last["usage"] = usage;
                        self.push(&last);
                    }
                } else {
                    self.push(&chunk);
                }
            }
            Event::Done(Err(e)) => self.fail(e.into()),
        }
    }

    /// Every choice is over.
    fn end(&mut self) {
        self.out.push_back(SseEvent::default().data("[DONE]"));
        self.over = true;
    }

    /// An error after the stream began: an error event, then the end (llama-server's way).
    fn fail(&mut self, e: ApiError) {
        tracing::warn!(id = %self.running.id(), status = e.status.as_u16(), "stream failed: {}", e.message);
        let body = e.body();
        self.push(&body);
        self.over = true;
    }
}
