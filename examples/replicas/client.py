"""Requests spread over two replicas, and the gateway's metrics naming each replica.

triton-gateway serve --config examples/replicas/gateway.yaml
python examples/replicas/client.py
"""

import os
from concurrent.futures import ThreadPoolExecutor

import httpx
from openai import OpenAI

base_url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
client = OpenAI(base_url=base_url, api_key="unused")


def ask(index: int) -> str:
    reply = client.completions.create(model="tiny", prompt=f"Request {index}:", max_tokens=8)
    return reply.choices[0].text


with ThreadPoolExecutor(8) as pool:
    answers = list(pool.map(ask, range(32)))
print(f"{len(answers)} answers")

metrics = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
for line in metrics.splitlines():
    if line.startswith(("gateway_replica_requests_total{", "gateway_replica_up{")):
        print(line)
