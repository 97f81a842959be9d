"""Drives `cdiffusers serve` with the official openai Python client (run by test_serve_openai.sh).

usage: openai_client.py BASE_URL API_KEY MODEL_NAME EXPECTED_SEED7.png INPUT.png EXPECTED_EDIT.png
EXPECTED_EDIT.png: `cdiffusers generate --image INPUT.png --strength 0.6 --seed 5` run on a file
named init_image.png (the name the PNG text shows; the client uploads INPUT.png under it).
Exits 0 when every check passes; prints what failed otherwise."""
import base64
import sys

import openai

base_url, key, model, expected_png, input_png, expected_edit = sys.argv[1:7]
failures = []


def check(what, cond):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
prompt = "a large yellow triangle on a purple background"

ids = [m.id for m in client.models.list()]
check("models.list names the model: %s" % ids, model in ids)

r = client.images.generate(model=model, prompt=prompt, n=2, size="64x64", response_format="b64_json",
                           extra_body={"seed": 7})
check("images.generate n=2 gives 2 images", len(r.data) == 2)
with open(expected_png, "rb") as f:
    check("first image == cdiffusers generate --seed 7", base64.b64decode(r.data[0].b64_json) == f.read())
check("second image differs (seed 8)", r.data[0].b64_json != r.data[1].b64_json)

try:
    client.images.generate(model=model, prompt=prompt, response_format="url")
    check("response_format url refused", False)
except openai.BadRequestError as e:
    check("url refusal says why: %s" % e, "not supported" in str(e))

try:
    client.images.generate(model=model, prompt=prompt, size="72x64")
    check("size 72x64 refused", False)
except openai.BadRequestError as e:
    check("size refusal names the multiple: %s" % e, "multiples of 16" in str(e))

with open(input_png, "rb") as img:
    r = client.images.edit(model=model, image=("init_image.png", img.read(), "image/png"), prompt=prompt,
                           response_format="b64_json", extra_body={"seed": 5, "strength": 0.6})
check("images.edit gives 1 image", len(r.data) == 1)
with open(expected_edit, "rb") as f:
    check("images.edit == cdiffusers generate --image --strength 0.6 --seed 5",
          base64.b64decode(r.data[0].b64_json) == f.read())

bad = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
try:
    bad.models.list()
    check("wrong key refused", False)
except openai.AuthenticationError:
    pass

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
