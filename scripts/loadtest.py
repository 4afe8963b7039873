#!/usr/bin/env python3
"""Load test for an OpenAI-compatible server (`onebit serve`, llama.cpp's `llama-server`).

Closed loop: at each concurrency level, that many clients send streamed chat completions back to
back (prompts varied from a list, every answer `--max-tokens` long: `ignore_eos`, which both
servers accept) until `--requests` have been sent. Per level it reports time to first token
(p50, p99), time per output token after the first (p50 over requests), requests per second,
output tokens per second over all clients, and errors; as a Markdown table, and with `--json FILE`
as JSON.

Soak mode (`--duration SECONDS`): one concurrency level for that long, reporting errors and,
with `--pid PID`, the server's resident memory (VmRSS from /proc/PID/status) sampled over time,
to show that it stays flat.

Needs the `openai` package (scripts/test-openai.sh keeps one in
${XDG_CACHE_HOME:-~/.cache}/onebit/venv-openai).

Examples:
  scripts/loadtest.py --base-url http://127.0.0.1:8080/v1 --concurrency 1,4,16,64 --requests 64
  scripts/loadtest.py --base-url http://127.0.0.1:8080/v1 --duration 600 --concurrency 16 --pid 1234
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time

try:
    import openai
except ImportError:
    sys.exit("loadtest.py needs the openai package: pip install 'openai==3.*' "
             "(or run it with ${XDG_CACHE_HOME:-~/.cache}/onebit/venv-openai/bin/python)")

TOPICS = [
    "Explain how a rainbow forms.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of ocean tides?",
    "Describe the water cycle to a ten-year-old.",
    "List some tips for learning a new language, with a sentence on each.",
    "Why do cats purr?",
    "Summarize the history of the printing press.",
    "Write a poem about autumn leaves.",
    "How does a refrigerator keep food cold?",
    "Compare trains and airplanes for a 500 km trip.",
    "What is photosynthesis and why does it matter?",
    "Give me a recipe for a simple vegetable soup.",
    "Describe a busy market in a small town on a Saturday morning, with its sounds and smells.",
    "How do bees communicate where flowers are?",
    "What should I pack for a week of hiking in the mountains?",
    "Explain the difference between weather and climate.",
]


def prompt(i):
    # A number per request, so that no two prompts are the same (no whole-prompt cache hits).
    return f"{TOPICS[i % len(TOPICS)]} (request {i})"


def pct(values, p):
    """Percentile p (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def rss_mib(pid):
    """Resident memory of a process in MiB (VmRSS), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Result:
    __slots__ = ("ok", "error", "start", "ttft", "tpot", "tokens", "end")

    def __init__(self):
        self.ok, self.error, self.ttft, self.tpot, self.tokens = False, None, None, None, 0
        self.start = self.end = 0.0


async def one_request(client, args, i):
    """One streamed completion; its timings, or the error."""
    r = Result()
    r.start = time.perf_counter()
    extra = {"ignore_eos": True}
    kw = {}
    if args.temperature is not None:
        kw["temperature"] = args.temperature
    try:
        if args.endpoint == "chat":
            stream = await client.chat.completions.create(
                model=args.model, messages=[{"role": "user", "content": prompt(i)}], max_tokens=args.max_tokens,
                stream=True, stream_options={"include_usage": True}, extra_body=extra, **kw)
        else:
            stream = await client.completions.create(
                model=args.model, prompt=prompt(i), max_tokens=args.max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body=extra, **kw)
        first = last = None
        pieces = 0
        usage = None
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                # llama-server sends a thinking model's thoughts as `reasoning_content`: tokens too.
                if args.endpoint == "chat":
                    text = c.delta.content or getattr(c.delta, "reasoning_content", None)
                else:
                    text = c.text
                if text:
                    if first is None:
                        first = now
                    last = now
                    pieces += 1
        # A chunk may carry several tokens (text held back at a possible stop string or an
        # incomplete UTF-8 character): count tokens from usage where the server sends it.
        r.tokens = usage.completion_tokens if usage is not None else pieces
        r.end = time.perf_counter()
        if first is None:
            r.error = "no tokens"
            return r
        r.ttft = first - r.start
        if r.tokens > 1:
            r.tpot = (last - first) / (r.tokens - 1)
        r.ok = True
        if args.max_tokens and r.tokens != args.max_tokens:
            r.error = f"short answer ({r.tokens} of {args.max_tokens} tokens)"
            r.ok = False
    except openai.APIStatusError as e:
        r.error = f"HTTP {e.status_code}"
    except (openai.APIConnectionError, openai.APITimeoutError) as e:
        r.error = type(e).__name__
    except Exception as e:  # noqa: BLE001 - every failure counts as an error, by kind
        r.error = type(e).__name__
    r.end = r.end or time.perf_counter()
    return r


async def run_clients(client, args, concurrency, n_requests=None, deadline=None, counter=None, on_done=None):
    """`concurrency` clients sending back to back until n_requests are sent or the deadline."""
    results = []
    next_i = counter if counter is not None else [0]

    async def worker():
        while True:
            if n_requests is not None and next_i[0] >= n_requests:
                return
            if deadline is not None and time.perf_counter() >= deadline:
                return
            i = next_i[0]
            next_i[0] += 1
            r = await one_request(client, args, args.prompt_offset + i)
            results.append(r)
            if on_done:
                on_done(r)
            if r.error and r.error.startswith(("HTTP", "API")):
                await asyncio.sleep(0.1)  # a refusing server (503 busy): do not spin

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


def summarize(concurrency, results, wall):
    ok = [r for r in results if r.ok]
    errors = {}
    for r in results:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    ttft = [r.ttft for r in ok]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    tokens = sum(r.tokens for r in results)

    def ms(x):
        return None if x is None else round(x * 1e3, 2)

    return {
        "concurrency": concurrency,
        "requests": len(results),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "ttft_p50_ms": ms(pct(ttft, 50)),
        "ttft_p99_ms": ms(pct(ttft, 99)),
        "tpot_p50_ms": ms(pct(tpot, 50)),
        "tpot_mean_ms": ms(statistics.fmean(tpot)) if tpot else None,
        "requests_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
        "output_tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
    }


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}"
    return str(v)


def table(rows, with_rss):
    cols = [("concurrency", "concurrency"), ("requests", "requests"), ("errors", "errors"),
            ("TTFT p50 (ms)", "ttft_p50_ms"), ("TTFT p99 (ms)", "ttft_p99_ms"), ("TPOT p50 (ms)", "tpot_p50_ms"),
            ("req/s", "requests_per_s"), ("output tok/s", "output_tokens_per_s")]
    if with_rss:
        cols.append(("RSS after (MiB)", "rss_mib"))
    out = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---:|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(k)) for _, k in cols) + " |")
    return "\n".join(out)


def slope_per_hour(samples):
    """Least-squares slope of RSS (MiB) over time, in MiB per hour."""
    if len(samples) < 3:
        return None
    ts = [s[0] for s in samples]
    ys = [s[1] for s in samples]
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    den = sum((t - mt) ** 2 for t in ts)
    if den == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den * 3600


async def soak(client, args):
    conc = args.concurrency[0]
    samples = []  # (seconds since start, RSS MiB)
    done = {"n": 0, "errors": 0}
    t0 = time.perf_counter()
    deadline = t0 + args.duration
    stop = asyncio.Event()

    def on_done(r):
        done["n"] += 1
        done["errors"] += bool(r.error)

    async def sampler():
        next_report = t0 + args.report_every
        while not stop.is_set():
            now = time.perf_counter()
            if args.pid:
                m = rss_mib(args.pid)
                if m is None:
                    print(f"warning: cannot read /proc/{args.pid}/status (did the server exit?)", file=sys.stderr)
                else:
                    samples.append((round(now - t0, 2), round(m, 1)))
            if now >= next_report:
                rss = f", RSS {samples[-1][1]:.1f} MiB" if samples else ""
                print(f"[{now - t0:7.0f} s] {done['n']} requests, {done['errors']} errors{rss}", file=sys.stderr)
                next_report += args.report_every
            try:
                await asyncio.wait_for(stop.wait(), args.rss_interval)
            except asyncio.TimeoutError:
                pass

    task = asyncio.create_task(sampler())
    results, wall = await run_clients(client, args, conc, deadline=deadline, on_done=on_done)
    stop.set()
    await task
    if args.pid and (m := rss_mib(args.pid)) is not None:
        samples.append((round(time.perf_counter() - t0, 2), round(m, 1)))
    summary = summarize(conc, results, wall)
    rss = None
    if samples:
        # After the first tenth of the run (warm-up: pools and caches filling), RSS should be flat.
        settled = [s for s in samples if s[0] >= args.duration / 10] or samples
        rss = {
            "samples": samples,
            "start_mib": samples[0][1],
            "settled_start_mib": settled[0][1],
            "min_mib": min(s[1] for s in samples),
            "max_mib": max(s[1] for s in samples),
            "end_mib": samples[-1][1],
            "settled_drift_mib": round(settled[-1][1] - settled[0][1], 1),
            "settled_slope_mib_per_hour": (round(x, 1) if (x := slope_per_hour(settled)) is not None else None),
        }
    return summary, rss


def rss_table(samples, rows=20):
    """Up to `rows` samples, evenly spaced, as a Markdown table."""
    if len(samples) > rows:
        step = (len(samples) - 1) / (rows - 1)
        samples = [samples[round(k * step)] for k in range(rows)]
    out = ["| t (s) | RSS (MiB) |", "|---:|---:|"]
    out += [f"| {t:.1f} | {m:.1f} |" for t, m in samples]
    return "\n".join(out)


async def main_async(args):
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=args.timeout)
    if not args.model:
        try:
            models = await client.models.list()
            args.model = models.data[0].id
        except Exception as e:  # noqa: BLE001
            print(f"warning: cannot list models ({e}); sending model \"default\"", file=sys.stderr)
            args.model = "default"
    print(f"# load test: {args.base_url}, model {args.model}, {args.endpoint}, "
          f"{args.max_tokens} output tokens per request", file=sys.stderr)
    report = {
        "base_url": args.base_url,
        "model": args.model,
        "endpoint": args.endpoint,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "client_host": platform.node(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if args.warmup:
        w, _ = await run_clients(client, args, 1, n_requests=args.warmup)
        bad = [r.error for r in w if r.error]
        if bad:
            print(f"warning: warm-up errors: {bad}", file=sys.stderr)
        args.prompt_offset += args.warmup
    if args.duration:
        summary, rss = await soak(client, args)
        report["soak"] = {"duration_s": args.duration, **summary, "rss": rss}
        print(f"\n### Soak: {args.duration:.0f} s at concurrency {summary['concurrency']}\n")
        print(table([summary], False))
        if summary["error_kinds"]:
            print(f"\nerrors: {summary['error_kinds']}")
        if rss:
            print(f"\nRSS of pid {args.pid}: start {rss['start_mib']:.1f} MiB, min {rss['min_mib']:.1f}, "
                  f"max {rss['max_mib']:.1f}, end {rss['end_mib']:.1f}; after the first tenth: drift "
                  f"{rss['settled_drift_mib']:+.1f} MiB, slope {fmt(rss['settled_slope_mib_per_hour'])} MiB/hour\n")
            print(rss_table(rss["samples"]))
    else:
        rows = []
        for c in args.concurrency:
            n = args.requests if args.requests else max(4 * c, 8)
            print(f"# concurrency {c}: {n} requests", file=sys.stderr)
            results, wall = await run_clients(client, args, c, n_requests=n)
            args.prompt_offset += n
            row = summarize(c, results, wall)
            if args.pid:
                row["rss_mib"] = rss_mib(args.pid)
            rows.append(row)
            print(f"#   {row['ok']}/{row['requests']} ok in {row['wall_s']} s, {row['output_tokens_per_s']} tok/s"
                  + (f", errors {row['error_kinds']}" if row["errors"] else ""), file=sys.stderr)
        report["levels"] = rows
        print(table(rows, bool(args.pid)))
        errs = {k: v for r in rows for k, v in r["error_kinds"].items()}
        if errs:
            print(f"\nerrors: {errs}")
    await client.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"\nwrote {args.json}", file=sys.stderr)
    levels = report.get("levels") or [report["soak"]]
    return 1 if args.fail_on_error and any(r["errors"] for r in levels) else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the API's base URL, with /v1")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    p.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--concurrency", default="1,4,16,64",
                   type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                   help="comma-separated levels (soak mode: the first)")
    p.add_argument("--requests", type=int, default=0,
                   help="requests per level (default: 4 x concurrency, at least 8)")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (ignore_eos)")
    p.add_argument("--temperature", type=float, default=None, help="default: the server's")
    p.add_argument("--warmup", type=int, default=1, help="requests sent before measuring")
    p.add_argument("--timeout", type=float, default=600, help="seconds per request")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--duration", type=float, default=0, metavar="SECONDS", help="soak mode: run this long")
    p.add_argument("--pid", type=int, help="the server's process id, to sample its RSS")
    p.add_argument("--rss-interval", type=float, default=1.0, help="seconds between RSS samples (soak)")
    p.add_argument("--report-every", type=float, default=30.0, help="seconds between progress lines (soak)")
    p.add_argument("--fail-on-error", action="store_true", help="exit 1 if any request failed")
    args = p.parse_args()
    args.prompt_offset = 0
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency needs levels of at least 1")
    if args.pid and rss_mib(args.pid) is None:
        p.error(f"cannot read VmRSS of pid {args.pid} from /proc/{args.pid}/status")
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
