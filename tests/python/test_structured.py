"""Structured output and tools through the official `openai` Python client: `parse()` with a
Pydantic model, and a whole tool-calling loop (call, tool result, final answer) on the demo model
(SmolLM2's ChatML template knows no tools, so onebit's generic JSON format carries them)."""

import json
from typing import Literal

import pydantic
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=40)
    country: str = pydantic.Field(max_length=40)
    population: int
    coastal: bool
    climate: Literal["hot", "mild", "cold"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_parse_with_a_pydantic_model(client, model_id, seed):
    done = client.chat.completions.parse(
        model=model_id,
        messages=[{"role": "user", "content": "Describe Lisbon."}],
        response_format=City,
        temperature=1.0,
        seed=seed,
        max_tokens=200,
    )
    msg = done.choices[0].message
    assert isinstance(msg.parsed, City), msg.content
    assert City.model_validate_json(msg.content) == msg.parsed


def test_json_object_mode(client, model_id):
    # A sampled answer may run past max_tokens (then it is cut, as in llama-server), and which
    # seeds finish depends on the kernel tier's float rounding: every answer that finished must
    # be a JSON object, and some must finish.
    finished = 0
    for seed in range(1, 9):
        done = client.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
            response_format={"type": "json_object"},
            temperature=1.0,
            seed=seed,
            max_tokens=300,
        )
        if done.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(done.choices[0].message.content), dict)
            finished += 1
    assert finished > 0


def test_tool_calling_loop(client, model_id):
    messages = [{"role": "user", "content": "What is the weather like in Paris?"}]
    first = client.chat.completions.create(
        model=model_id, messages=messages, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=200
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit"), args
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})})
    final = client.chat.completions.create(
        model=model_id, messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=40
    )
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length")
    assert not answer.message.tool_calls
    assert answer.message.content


def test_streamed_tool_call_matches_whole(client, model_id):
    kw = dict(
        model=model_id,
        messages=[{"role": "user", "content": "Weather in Oslo, please."}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0.7,
        seed=11,
        max_tokens=200,
    )
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        finish = c.finish_reason or finish
        for tc in c.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            if tc.function and tc.function.name:
                slot["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (w.function.name, w.function.arguments) for w in whole
    ]
