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
use onebit_engine::chat_format::OutputParser;
use onebit_engine::{Completion, Event};
use serde_json::{Value as Json, json};

use crate::chat_output::{delta_json, finish_with};
use crate::error::ApiError;
use crate::generate::{Running, finish_reason};
use crate::shapes::{Kind, Shape};

struct StreamState {
    running: Running,
    shape: Shape,
    include_usage: bool,
    /// Events ready to go out.
    out: VecDeque<SseEvent>,
    /// Per choice: text sent so far (bytes, for the legacy logprobs' offsets).
    sent: Vec<usize>,
    completions: Vec<Option<Completion>>,
    /// Per choice, when the chat's text is parsed (tools, thinking).
    parsers: Vec<Option<OutputParser>>,
    /// Per choice: whether it made tool calls.
    called: Vec<bool>,
    over: bool,
}

/// The SSE response for a running request.
/// `ping`: the quiet time after which a comment ping goes out.
pub fn respond(running: Running, shape: Shape, include_usage: bool, ping: Duration) -> Response {
    let n = running.n_choices();
    let parsers = (0..n).map(|_| shape.output.as_ref().map(|p| p.parser())).collect();
    let mut st = StreamState {
        running,
        shape,
        include_usage,
        out: VecDeque::new(),
        sent: vec![0; n],
        completions: (0..n).map(|_| None).collect(),
        parsers,
        called: vec![false; n],
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
    Sse::new(events).keep_alive(KeepAlive::new().interval(ping).text("ping")).into_response()
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
                self.text(i, &text, lp);
            }
            Event::Text { text } => {
                self.sent[i] += text.len();
                self.text(i, &text, Json::Null);
            }
            Event::Prefilled { .. } => {}
            Event::Done(Ok(c)) => {
                if let Some(p) = self.parsers[i].as_mut() {
                    let deltas = p.finish();
                    self.deltas(i, deltas, Json::Null);
                }
                let finish = finish_with(self.called[i], finish_reason(c.finish));
                let mut chunk = self.shape.chunk(i, None, Json::Null, Some(finish));
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

    /// New text of choice `i`: as it is, or through the choice's parser.
    fn text(&mut self, i: usize, text: &str, logprobs: Json) {
        match self.parsers[i].as_mut() {
            None => {
                let chunk = self.shape.chunk(i, Some(text), logprobs, None);
                self.push(&chunk);
            }
            Some(p) => {
                let deltas = p.push(text);
                self.deltas(i, deltas, logprobs);
            }
        }
    }

    /// Parsed deltas as chunks; the token's logprobs ride on the first (or on an empty delta
    /// when the parser holds the text back).
    fn deltas(&mut self, i: usize, deltas: Vec<onebit_engine::chat_format::ChatDelta>, mut logprobs: Json) {
        let objects: Vec<Json> = deltas.iter().flat_map(delta_json).collect();
        if objects.is_empty() && !logprobs.is_null() {
            let chunk = self.shape.delta_chunk(i, json!({}), logprobs, None);
            return self.push(&chunk);
        }
        for d in objects {
            self.called[i] |= d.get("tool_calls").is_some();
            let chunk = self.shape.delta_chunk(i, d, std::mem::take(&mut logprobs), None);
            self.push(&chunk);
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
