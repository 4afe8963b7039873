//! `/metrics`: Prometheus text with llama-server's metric names (so its dashboards work), plus
//! the latency histograms vLLM users rely on and the prefix cache's hit rate. Kept in a
//! recorder of this server's own (not the process-global one), so that several servers in one
//! process (the tests) do not mix their figures.

use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use onebit_engine::{Completion, SchedulerStats};
use onebit_model::BLOCK_TOKENS;

/// Latency buckets in seconds, from a fast token to a long prompt.
const BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

#[derive(Default)]
struct Totals {
    /// Prompt tokens computed (not those taken from the prefix cache), and their time.
    prompt_tokens: u64,
    prompt_seconds: f64,
    predicted_tokens: u64,
    predicted_seconds: f64,
    /// All prompt tokens, and those the prefix cache held.
    prompt_tokens_all: u64,
    cached_tokens: u64,
}

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    totals: Mutex<Totals>,
    ttft: Histogram,
    tpot: Histogram,
    queue: Histogram,
    e2e: Histogram,
    requests: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let recorder =
            PrometheusBuilder::new().set_buckets(&BUCKETS).expect("the bucket list is not empty").build_recorder();
        let handle = recorder.handle();
        let hist = |name: &'static str, help: &'static str| {
            recorder.describe_histogram(KeyName::from_const_str(name), None, SharedString::const_str(help));
            recorder.register_histogram(&Key::from_static_name(name), &meta())
        };
        let ttft = hist("onebit:time_to_first_token_seconds", "Time from a request's arrival to its first token.");
        let tpot = hist("onebit:time_per_output_token_seconds", "Time per generated token after the first.");
        let queue = hist("onebit:request_queue_time_seconds", "Time requests waited for a place in the batch.");
        let e2e = hist("onebit:e2e_request_latency_seconds", "Time from a request's arrival to its last token.");
        recorder.describe_counter(
            KeyName::from_const_str("onebit:requests_finished_total"),
            None,
            SharedString::const_str("Requests answered to the end."),
        );
        let requests = recorder.register_counter(&Key::from_static_name("onebit:requests_finished_total"), &meta());
        Metrics { recorder, handle, totals: Mutex::new(Totals::default()), ttft, tpot, queue, e2e, requests }
    }

    /// Count a finished choice; `e2e` is its request's latency.
    pub fn record(&self, c: &Completion, e2e: f64) {
        let computed = (c.usage.prompt_tokens - c.usage.cached_tokens) as u64;
        {
            let mut t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
            t.prompt_tokens += computed;
            t.prompt_seconds += c.timings.prefill;
            t.predicted_tokens += c.usage.completion_tokens as u64;
            t.predicted_seconds += c.timings.decode;
            t.prompt_tokens_all += c.usage.prompt_tokens as u64;
            t.cached_tokens += c.usage.cached_tokens as u64;
        }
        if c.usage.completion_tokens > 0 {
            self.ttft.record(c.timings.first_token);
        }
        if c.usage.completion_tokens > 1 {
            let after_first = c.timings.decode - (c.timings.first_token - c.timings.queue - c.timings.prefill);
            self.tpot.record(after_first.max(0.0) / (c.usage.completion_tokens - 1) as f64);
        }
        self.queue.record(c.timings.queue);
        self.e2e.record(e2e);
        self.requests.increment(1);
    }

    /// The Prometheus text, with the engine's state as it is now.
    pub fn render(&self, stats: Option<&SchedulerStats>) -> String {
        let (prompt_tokens, prompt_seconds, predicted_tokens, predicted_seconds, hit) = {
            let t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
            let hit = if t.prompt_tokens_all > 0 { t.cached_tokens as f64 / t.prompt_tokens_all as f64 } else { 0.0 };
            (t.prompt_tokens, t.prompt_seconds, t.predicted_tokens, t.predicted_seconds, hit)
        };
        let ratio = |n: f64, d: f64| if d > 0.0 { n / d } else { 0.0 };
        self.counter("llamacpp:prompt_tokens_total", "Number of prompt tokens processed.", prompt_tokens);
        self.gauge("llamacpp:prompt_seconds_total", "Prompt process time.", prompt_seconds);
        self.counter("llamacpp:tokens_predicted_total", "Number of generation tokens processed.", predicted_tokens);
        self.gauge("llamacpp:tokens_predicted_seconds_total", "Predict process time.", predicted_seconds);
        self.gauge(
            "llamacpp:prompt_tokens_seconds",
            "Average prompt throughput in tokens/s.",
            ratio(prompt_tokens as f64, prompt_seconds),
        );
        self.gauge(
            "llamacpp:predicted_tokens_seconds",
            "Average generation throughput in tokens/s.",
            ratio(predicted_tokens as f64, predicted_seconds),
        );
        self.gauge("onebit:prefix_cache_hit_ratio", "Share of prompt tokens taken from the prefix cache.", hit);
        if let Some(s) = stats {
            self.counter("llamacpp:n_decode_total", "Total number of llama_decode() calls.", s.steps);
            self.gauge(
                "llamacpp:n_busy_slots_per_decode",
                "Average number of busy slots per llama_decode() call.",
                ratio(s.busy_slot_steps as f64, s.steps as f64),
            );
            let used = s.blocks.total - s.blocks.free - s.blocks.cached_idle;
            self.gauge(
                "llamacpp:kv_cache_usage_ratio",
                "KV-cache usage. 1 means 100 percent usage.",
                ratio(used as f64, s.blocks.total as f64),
            );
            self.gauge("llamacpp:kv_cache_tokens", "KV-cache tokens.", (used * BLOCK_TOKENS) as f64);
            if let Some(w) = s.window_blocks {
                let used = w.total - w.free - w.cached_idle;
                self.gauge(
                    "onebit:kv_window_usage_ratio",
                    "Usage of the sliding-window layers' own KV blocks. 1 means 100 percent usage.",
                    ratio(used as f64, w.total as f64),
                );
            }
            self.gauge("llamacpp:requests_processing", "Number of requests processing.", s.running as f64);
            self.gauge("llamacpp:requests_deferred", "Number of requests deferred.", s.waiting as f64);
            self.counter("onebit:preemptions_total", "Sequences put back in the queue to free memory.", s.preemptions);
            self.counter("llamacpp:spec_decode_draft_tokens_total", "Drafted tokens verified.", s.drafted);
            self.counter("llamacpp:spec_decode_accepted_tokens_total", "Drafted tokens kept.", s.accepted);
            self.gauge(
                "llamacpp:spec_decode_acceptance_rate",
                "Share of drafted tokens kept.",
                ratio(s.accepted as f64, s.drafted as f64),
            );
        }
        self.handle.render()
    }

    fn counter(&self, name: &'static str, help: &'static str, value: u64) {
        self.recorder.describe_counter(KeyName::from_const_str(name), None, SharedString::const_str(help));
        self.recorder.register_counter(&Key::from_static_name(name), &meta()).absolute(value);
    }

    fn gauge(&self, name: &'static str, help: &'static str, value: f64) {
        self.recorder.describe_gauge(KeyName::from_const_str(name), None, SharedString::const_str(help));
        let g: Gauge = self.recorder.register_gauge(&Key::from_static_name(name), &meta());
        g.set(value);
    }
}

fn meta() -> Metadata<'static> {
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()))
}
