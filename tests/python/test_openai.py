"""`onebit serve` through the official `openai` Python client: the answers' shapes, exact usage,
streaming, stop strings, seeds, logprobs, several choices, and errors as the client's typed
exceptions. Run with `bash scripts/test-openai.sh` (fixtures in conftest.py)."""

import concurrent.futures
import time

import openai
import pytest

from conftest import API_KEY, MODEL, SMALL_CTX, http

CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]
PROMPT = "The capital of France is"
# Same length every time: no end-of-sequence token ends an answer early.
FIXED = {"ignore_eos": True}


def chat(client, model, messages=CHAT, **kw):
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model=model, messages=messages, **kw)


def complete(client, model, prompt=PROMPT, **kw):
    kw.setdefault("max_tokens", 8)
    return client.completions.create(model=model, prompt=prompt, **kw)


def error_of(exc):
    """The `error` object of an API error's body (the client keeps either it or the whole body)."""
    body = exc.body
    assert isinstance(body, dict), body
    return body.get("error", body)


def n_tokens(server, text):
    """Tokens of `text` as the server counts a prompt (special tokens added and parsed)."""
    status, body = http(server.url + "/tokenize", {"content": text, "add_special": True})
    assert status == 200, body
    return len(body["tokens"])


def chat_prompt_tokens(server, messages):
    status, body = http(server.url + "/apply-template", {"messages": messages})
    assert status == 200, body
    return n_tokens(server, body["prompt"])


# --- models and health ------------------------------------------------------------------------


def test_health(server):
    assert http(server.url + "/health") == (200, {"status": "ok"})


def test_models_list_has_one_model(client):
    models = client.models.list()
    assert len(models.data) == 1
    m = models.data[0]
    assert m.object == "model"
    assert m.id == MODEL.name  # the file name (no --alias)
    assert isinstance(m.created, int)


# --- whole answers ----------------------------------------------------------------------------


def test_chat_completion_shape_and_usage(server, client, model_id):
    r = chat(client, model_id, max_tokens=8, temperature=0, extra_body=FIXED)
    assert r.object == "chat.completion"
    assert r.id and r.model == model_id
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason == "length"
    assert c.logprobs is None
    u = r.usage
    assert u.completion_tokens == 8
    assert u.prompt_tokens == chat_prompt_tokens(server, CHAT)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_text_completion_shape_and_usage(server, client, model_id):
    r = complete(client, model_id, max_tokens=8, temperature=0, extra_body=FIXED)
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and isinstance(c.text, str) and c.text
    assert c.finish_reason == "length"
    u = r.usage
    assert u.completion_tokens == 8
    assert u.prompt_tokens == n_tokens(server, PROMPT)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_natural_end_is_stop(client, model_id):
    # A short question the model answers well within the limit.
    r = chat(client, model_id, [{"role": "user", "content": "Say only: yes"}], max_tokens=64, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens < 64


def test_max_tokens_one(client, model_id):
    r = complete(client, model_id, max_tokens=1, temperature=0, extra_body=FIXED)
    assert r.usage.completion_tokens == 1
    assert r.choices[0].finish_reason == "length"


# --- streaming --------------------------------------------------------------------------------


def test_chat_stream_matches_whole_answer(client, model_id):
    whole = chat(client, model_id, max_tokens=16, temperature=0, extra_body=FIXED)
    stream = chat(client, model_id, max_tokens=16, temperature=0, extra_body=FIXED, stream=True)
    chunks = list(stream)
    assert chunks, "no chunks"
    ids = {ch.id for ch in chunks}
    assert len(ids) == 1
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    # Without include_usage no chunk carries usage.
    assert all(ch.usage is None for ch in chunks)


def test_text_stream_matches_whole_answer(client, model_id):
    whole = complete(client, model_id, max_tokens=16, temperature=0, extra_body=FIXED)
    chunks = list(complete(client, model_id, max_tokens=16, temperature=0, extra_body=FIXED, stream=True))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_stream_include_usage(client, model_id, kind):
    make = chat if kind == "chat" else complete
    whole = make(client, model_id, max_tokens=8, temperature=0, extra_body=FIXED)
    chunks = list(make(client, model_id, max_tokens=8, temperature=0, extra_body=FIXED, stream=True,
                       stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 8
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert all(ch.usage is None for ch in chunks[:-1])
    assert all(ch.choices for ch in chunks[:-1])


# --- stop strings -----------------------------------------------------------------------------


def test_stop_string(client, model_id):
    full = chat(client, model_id, max_tokens=32, temperature=0, extra_body=FIXED).choices[0].message.content
    words = full.split()
    assert len(words) >= 4, full
    stop = words[2]  # a word in the middle of the greedy answer
    expected = full[: full.index(stop)]
    r = chat(client, model_id, max_tokens=32, temperature=0, extra_body=FIXED, stop=[stop, "never-seen-xyzzy"])
    c = r.choices[0]
    assert stop not in c.message.content
    assert c.message.content == expected
    assert c.finish_reason == "stop"
    # Streamed: the held-back start of the stop string must not leak either.
    chunks = list(chat(client, model_id, max_tokens=32, temperature=0, extra_body=FIXED, stop=stop, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == expected
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]


def test_stop_string_text_completion(client, model_id):
    full = complete(client, model_id, max_tokens=16, temperature=0, extra_body=FIXED).choices[0].text
    stop = "."
    if stop not in full:
        pytest.skip(f"greedy answer has no '.': {full!r}")
    r = complete(client, model_id, max_tokens=16, temperature=0, extra_body=FIXED, stop=stop)
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


# --- seeds and determinism --------------------------------------------------------------------


def test_same_seed_same_text(client, model_id):
    kw = {"max_tokens": 16, "temperature": 0.9, "extra_body": FIXED}
    a = chat(client, model_id, seed=1234, **kw).choices[0].message.content
    b = chat(client, model_id, seed=1234, **kw).choices[0].message.content
    assert a == b


def test_different_seeds_differ(client, model_id):
    # Sampling at temperature 0.9 over 16 tokens: four seeds giving one text would mean the seed
    # is ignored (or the sampler is greedy).
    kw = {"max_tokens": 16, "temperature": 0.9, "top_p": 1.0, "extra_body": {**FIXED, "top_k": 0, "min_p": 0.0}}
    texts = {chat(client, model_id, seed=s, **kw).choices[0].message.content
             for s in (1, 2, 3, 4)}
    assert len(texts) > 1, texts


def test_greedy_is_batch_independent(client, model_id):
    """Greedy answers are the same alone and alongside other requests (--parallel 4)."""
    prompts = ["Name a color.", "Count to five.", "What is 2+2?", "Name a fruit."]
    msgs = [[{"role": "user", "content": p}] for p in prompts]
    alone = [chat(client, model_id, m, max_tokens=12, temperature=0, extra_body=FIXED).choices[0].message.content
             for m in msgs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(
            lambda m: chat(client, model_id, m, max_tokens=12, temperature=0, extra_body=FIXED)
            .choices[0].message.content, msgs))
    assert together == alone


# --- logprobs ---------------------------------------------------------------------------------


def test_chat_logprobs(client, model_id):
    r = chat(client, model_id, max_tokens=6, temperature=0, extra_body=FIXED, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for e in content:
        assert isinstance(e.token, str)
        assert e.logprob <= 0
        assert len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert all(t <= 0 for t in tops)
        assert tops == sorted(tops, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)
        assert e.bytes == list(e.token.encode())
    assert "".join(e.token for e in content) == r.choices[0].message.content


def test_chat_logprobs_streamed(client, model_id):
    chunks = list(chat(client, model_id, max_tokens=6, temperature=0, extra_body=FIXED, logprobs=True,
                       top_logprobs=2, stream=True))
    entries = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert len(entries) == 6
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)


def test_chat_logprobs_without_top(client, model_id):
    r = chat(client, model_id, max_tokens=3, temperature=0, extra_body=FIXED, logprobs=True)
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert all(e.top_logprobs == [] for e in content)


def test_text_completion_legacy_logprobs(client, model_id):
    r = complete(client, model_id, max_tokens=4, temperature=0, extra_body=FIXED, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(x <= 0 for x in lp.token_logprobs)
    for tok, top in zip(lp.tokens, lp.top_logprobs):
        assert len(top) == 2
        assert tok in top  # greedy: the chosen token is the best one
        assert all(v <= 0 for v in top.values())
    offsets = [0]
    for t in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp.text_offset == offsets


# --- several choices --------------------------------------------------------------------------


def test_chat_n2(server, client, model_id):
    r = chat(client, model_id, max_tokens=6, temperature=0.9, seed=7, n=2, extra_body=FIXED)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.finish_reason == "length" and c.message.content for c in r.choices)
    assert r.usage.completion_tokens == 12  # both choices
    assert r.usage.prompt_tokens == chat_prompt_tokens(server, CHAT)  # the prompt once
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_text_n2_streamed(client, model_id):
    chunks = list(complete(client, model_id, max_tokens=4, temperature=0.9, seed=7, n=2, extra_body=FIXED,
                           stream=True, stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    finishes = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert finishes == {0: "length", 1: "length"}
    assert texts[0] and texts[1]
    assert chunks[-1].usage.completion_tokens == 8


# --- errors as typed exceptions ---------------------------------------------------------------


@pytest.mark.parametrize("bad", [{"temperature": -1}, {"top_p": 7}, {"max_tokens": -5}, {"n": 0}])
def test_bad_values_are_bad_requests(client, model_id, bad):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model_id, **bad)
    err = error_of(e.value)
    assert e.value.status_code == 400
    assert err["type"] == "invalid_request_error"
    assert err["code"] == 400
    assert next(iter(bad)) in err["message"]


def test_top_logprobs_without_logprobs(client, model_id):
    with pytest.raises(openai.BadRequestError):
        chat(client, model_id, top_logprobs=3)


def test_wrong_type_is_bad_request(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model_id, extra_body={"temperature": "hot"})
    assert "temperature" in error_of(e.value)["message"]


def test_empty_messages(client, model_id):
    with pytest.raises(openai.BadRequestError):
        chat(client, model_id, messages=[])


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_context(client, model_id, stream):
    long = "hello " * 5000  # over 4096 tokens, the server's context
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, model_id, prompt=long, max_tokens=1, stream=stream)
    err = error_of(e.value)
    assert err["type"] == "exceed_context_size_error"
    assert err["code"] == 400
    assert err["n_prompt_tokens"] > err["n_ctx"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model_id, messages=[{"role": "user", "content": long}], max_tokens=1, stream=stream)
    assert error_of(e.value)["type"] == "exceed_context_size_error"


def test_unknown_route_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.get("/no-such-endpoint", cast_to=object)
    assert error_of(e.value)["code"] == 404


def test_unknown_model_retrieve_is_not_found(client):
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_wrong_api_key(small_server):
    bad = small_server.client(api_key="wrong-key")
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    err = error_of(e.value)
    assert e.value.status_code == 401
    assert err["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="x", messages=CHAT, max_tokens=1)
    status, body = http(small_server.url + "/v1/models")  # no key at all
    assert status == 401 and body["error"]["type"] == "authentication_error"
    # The right key works, and /health needs none.
    good = small_server.client(api_key=API_KEY)
    assert len(good.models.list().data) == 1
    r = good.chat.completions.create(model="x", messages=CHAT, max_tokens=2, temperature=0)
    assert r.usage.completion_tokens <= 2
    assert http(small_server.url + "/health") == (200, {"status": "ok"})


def test_prompt_longer_than_small_context(small_server):
    client = small_server.client(api_key=API_KEY)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="x", prompt="hello " * 300, max_tokens=1)
    err = error_of(e.value)
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == SMALL_CTX
    assert err["n_prompt_tokens"] > SMALL_CTX


def test_busy_server_answers_503_with_retry_after(small_server):
    """One place and no queue: a second request while one runs is refused (503, Retry-After);
    closing the running stream cancels it and frees the place."""
    client = small_server.client(api_key=API_KEY)
    stream = client.completions.create(model="x", prompt="Once upon a time", max_tokens=200, stream=True,
                                       extra_body=FIXED)
    next(iter(stream))  # the first is running
    try:
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model="x", prompt="Hi", max_tokens=1)
        assert e.value.status_code == 503
        assert error_of(e.value)["type"] == "unavailable_error"
        assert e.value.response.headers.get("retry-after") == "1"
    finally:
        stream.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            r = client.completions.create(model="x", prompt="Hi", max_tokens=1)
            break
        except openai.InternalServerError:
            assert time.monotonic() < deadline, "the cancelled stream still holds the only place"
            time.sleep(0.05)
    assert r.usage.completion_tokens <= 1
