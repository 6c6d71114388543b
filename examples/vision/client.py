"""A chat with an image, sent as a data: URL, through the openai SDK.

triton-gateway serve --config examples/vision/gateway.yaml
python examples/vision/client.py
"""

import base64
import io
import os

from openai import OpenAI
from PIL import Image

buffer = io.BytesIO()
Image.new("RGB", (48, 40), "teal").save(buffer, format="PNG")
url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
client = OpenAI(
    base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"), api_key="unused"
)
answer = client.chat.completions.create(
    model="vis",
    max_tokens=16,
    messages=[
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url, "detail": "auto"}},
                {"type": "text", "text": "What is this?"},
            ],
        }
    ],
)
print("answer:", repr(answer.choices[0].message.content))
print("prompt tokens (the image counts as its 16 tokens):", answer.usage.prompt_tokens)
