"""A forced tool call and a JSON answer of a schema, through the openai SDK.

    triton-gateway serve --config examples/tools/gateway.yaml
    python examples/tools/client.py

Guided decoding makes the call's arguments valid JSON of the function's parameters and the
answer valid JSON of the schema, whatever the (small) model would have written.
"""

import json
import os

from openai import OpenAI

client = OpenAI(
    base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"), api_key="unused"
)
weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]}},
            "required": ["city"],
        },
    },
}
reply = client.chat.completions.create(
    model="smollm2",
    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    tools=[weather],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    max_tokens=32,
    temperature=0,
)
call = reply.choices[0].message.tool_calls[0]
print("tool call:", call.function.name, json.loads(call.function.arguments))

capital = {
    "type": "object",
    "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
    "required": ["country", "capital"],
}
answer = client.chat.completions.create(
    model="smollm2",
    messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
    response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": capital}},
    max_tokens=48,
    temperature=0,
)
print("structured answer:", json.loads(answer.choices[0].message.content))
