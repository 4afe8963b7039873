#!/usr/bin/env python3
"""Speculative decoding when several sequences decode together: where it stops paying.

Against a running `onebit serve` (started with `--parallel` at least the largest level), each of
N clients asks at once to copy its own passage of a text (grounded work, where prompt lookup
drafts well), greedy, `--max-tokens` tokens past any end of text; once with `"speculative":
{"mode": "off"}` and once with the mode under test, alternated `--reps` times. Prompts are sent
once beforehand (one token each) so that the timed runs take them from the prefix cache. Reports
the aggregate decode rate (all clients' tokens over the wall time) per level and mode, and the
ratio. Standard library only.

Example:
  onebit serve -m SmolLM2-135M-Instruct.Q4_1.gguf -c 2048 --parallel 8 --port 8090 &
  scripts/bench-spec-batch.py --base-url http://127.0.0.1:8090 --text moby-dick.txt --levels 1,2,4,8
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request


def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def passages(path, n, size):
    """`n` passages of about `size` bytes from the text's chapters (past its front matter)."""
    text = open(path, encoding="utf-8", errors="ignore").read()
    start = text.find("CHAPTER 1")
    out = []
    at = max(start, 0)
    for _ in range(n):
        end = text.find(". ", at + size) + 1
        out.append(text[at:end].strip())
        at = end
    return out


def body(passage, mode, max_tokens):
    return {
        "messages": [{"role": "user", "content": "Copy the following text exactly, word for word.\n\n" + passage}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "speculative": {"mode": mode},
    }


def run_level(base, texts, mode, max_tokens):
    """All clients at once; returns (aggregate tokens/s, drafted-free check of answers)."""
    results = [None] * len(texts)

    def client(i):
        results[i] = post(base, body(texts[i], mode, max_tokens))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    return tokens / wall, [r["choices"][0]["message"]["content"] for r in results]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8090")
    ap.add_argument("--text", required=True, help="a long plain text (e.g. Moby-Dick)")
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--mode", default="lookup")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--passage-bytes", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    texts = passages(a.text, max(levels), a.passage_bytes)
    for p in texts:
        post(a.base_url, body(p, "off", 1))
    print("| sequences | off (t/s) | %s (t/s) | ratio | same answers |" % a.mode)
    print("|---:|---:|---:|---:|---|")
    for n in levels:
        off, on, same = [], [], True
        for _ in range(a.reps):
            r_off, ans_off = run_level(a.base_url, texts[:n], "off", a.max_tokens)
            r_on, ans_on = run_level(a.base_url, texts[:n], a.mode, a.max_tokens)
            off.append(r_off)
            on.append(r_on)
            same &= ans_off == ans_on
        ratio = statistics.median(y / x for x, y in zip(off, on))
        print("| %d | %s | %s | %.2f× | %s |" % (n, " / ".join("%.1f" % x for x in off),
                                                 " / ".join("%.1f" % x for x in on), ratio, "yes" if same else "NO"))


if __name__ == "__main__":
    main()
