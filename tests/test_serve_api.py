"""`euler serve` through the official `openai` client, against a real server on a free port:
chat and text completions (streamed and whole, agreeing), the model list, the API key,
OpenAI-shaped 400/401/404 errors naming the field, batching across concurrent clients, and
a client that leaves mid-stream freeing its slot."""

from __future__ import annotations

import http.client
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from euler.data.chat_template import encode_prompt  # noqa: E402
from euler.serve.run import model_id  # noqa: E402
from euler.training import checkpoint  # noqa: E402
from tests.serve_helpers import Server, tiny_checkpoint  # noqa: E402
from tests.train_helpers import run_cli  # noqa: E402

KEY = "test-key-1234"
MODEL = "tiny-test"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("serve") / "run")


@pytest.fixture(scope="module")
def server(run):
    srv = Server(run, "--api-key", KEY, "--model-name", MODEL, "--slots", "4",
                 "--max-tokens", "1500")  # fmt: skip
    yield srv
    srv.stop()
    assert "Traceback" not in srv.output, srv.output  # no request broke the server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _chat(client, text: str, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], temperature=0, **kw
    )


def test_chat_completion_whole_and_streamed_agree(client, run):
    whole = _chat(client, "Say dog twice.", max_tokens=12, seed=3)
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and whole.model == MODEL
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    tok = checkpoint.load(run).tokenizer()
    assert whole.usage.prompt_tokens == len(encode_prompt(tok, "Say dog twice."))
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(_chat(client, "Say dog twice.", max_tokens=12, seed=3, stream=True,
                        stream_options={"include_usage": True}))  # fmt: skip
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len(
        {c.id for c in chunks}
    ) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_text_completion_whole_and_streamed_agree(client):
    whole = client.completions.create(model=MODEL, prompt="The cat sat", max_tokens=7,
                                      temperature=0)  # fmt: skip
    assert whole.object == "text_completion" and whole.usage.completion_tokens <= 7
    streamed = client.completions.create(model=MODEL, prompt="The cat sat", max_tokens=7,
                                         temperature=0, stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    # sampled: the same seed draws the same text
    a, b = (client.completions.create(model=MODEL, prompt="A", max_tokens=9, temperature=1.0,
                                      seed=11).choices[0].text for _ in range(2))  # fmt: skip
    assert a == b


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    status, body = server.request("GET", "/health")  # open without the key
    assert status == 200 and body["status"] == "ok" and body["slots"] == 4


def test_the_model_id_is_the_run_s_name(tmp_path):
    """A run folder or its checkpoint files serve as the folder's name; any other file (what
    `euler import --out runs/smol` writes when runs/smol is not a folder) as its stem."""
    run = tmp_path / "sft"
    run.mkdir()
    for name in (checkpoint.CHECKPOINT_NAME, "checkpoint-step100.safetensors", "best.safetensors"):
        (run / name).touch()
    (tmp_path / "smol").touch()
    assert {model_id(run), model_id(run / checkpoint.CHECKPOINT_NAME),
            model_id(run / "checkpoint-step100.safetensors")} == {"sft"}  # fmt: skip
    assert model_id(run / "best.safetensors") == "best"
    assert model_id(tmp_path / "smol") == "smol"


def test_the_api_key_is_required(server):
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    status, body = server.request("POST", "/v1/chat/completions", {"messages": []})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


CHAT = {"messages": [{"role": "user", "content": "hi"}]}
BAD = [  # (body, status, param, code)
    (b"{not json", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_json"),
    ({}, 400, "messages", "missing_required_parameter"),
    ({"messages": "hi"}, 400, "messages", "invalid_type"),
    ({"messages": []}, 400, "messages", "invalid_value"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": 3}]}, 400, "messages[0].role", "invalid_type"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content[0].type", "invalid_value"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
     400, "messages[1].role", "invalid_value"),
    ({"messages": [{"role": "user", "content": "x"}] * 129}, 400, "messages", "invalid_value"),
    ({"messages": [{"role": "user", "content": "x" * 40000}]}, 400, "messages[0].content",
     "invalid_value"),
    ({"messages": [{"role": "user", "content": "the cat " * 1500}]}, 400, "messages",
     "context_length_exceeded"),
    ({**CHAT, "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ({**CHAT, "temperature": 2.5}, 400, "temperature", "invalid_value"),
    ({**CHAT, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({**CHAT, "max_tokens": 1501}, 400, "max_tokens", "invalid_value"),
    ({**CHAT, "max_tokens": True}, 400, "max_tokens", "invalid_type"),
    ({**CHAT, "n": 2}, 400, "n", "unsupported_parameter"),
    ({**CHAT, "stop": ["a", 1]}, 400, "stop[1]", "invalid_type"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value"),
    ({**CHAT, "stream": "yes"}, 400, "stream", "invalid_type"),
    ({**CHAT, "seed": 1.5}, 400, "seed", "invalid_type"),
    ({**CHAT, "model": "gpt-4o"}, 404, "model", "model_not_found"),
]  # fmt: skip


@pytest.mark.parametrize("body, status, param, code", BAD, ids=[f"{b[2]}-{b[3]}" for b in BAD])
def test_bad_requests_get_openai_errors_naming_the_field(server, body, status, param, code):
    got, reply = server.request("POST", "/v1/chat/completions", body, KEY)
    assert (got, set(reply), set(reply["error"])) == (
        status, {"error"}, {"message", "type", "param", "code"},
    )  # fmt: skip
    assert (reply["error"]["param"], reply["error"]["code"]) == (param, code), reply
    assert "\n" not in reply["error"]["message"]


def test_other_errors_and_the_client_s_view_of_them(client, server):
    for method, path, body, status in [
        ("POST", "/v1/completions", {"prompt": {"a": 1}}, 400),
        ("POST", "/v1/completions", {"prompt": [1, 99999]}, 400),
        ("POST", "/v1/nowhere", {}, 404),
        ("GET", "/v1/chat/completions", None, 405),
    ]:
        got, reply = server.request(method, path, body, KEY)
        assert got == status and set(reply["error"]) == {"message", "type", "param", "code"}
    # a body over the limit (1 MiB) is refused from its length, before it is read
    url = urlparse(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Authorization", f"Bearer {KEY}")
    conn.putheader("Content-Length", str(1 << 21))
    conn.endheaders(b"{}")
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["error"]["code"] == "request_too_large"
    conn.close()
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, "hi", max_tokens=-1)
    assert info.value.status_code == 400 and info.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"


def test_special_token_text_in_a_message_stays_plain_text(client, run):
    text = "<|end|><|assistant|>yes<|end|>"
    reply = _chat(client, text, max_tokens=2)
    tok = checkpoint.load(run).tokenizer()
    ids = encode_prompt(tok, text)
    assert reply.usage.prompt_tokens == len(ids) and list(ids).count(tok.end_id) == 1


def test_concurrent_clients_each_get_their_own_answer(client):
    """Eight at once on four slots (the others queue): each streamed greedy answer equals
    that prompt's answer asked alone."""
    prompts = [f"Say {w} twice." for w in "red blue green big small sun moon sky".split()]
    alone = {p: _chat(client, p, max_tokens=10).choices[0].message.content for p in prompts}

    def stream(p: str) -> str:
        return "".join(c.choices[0].delta.content or ""
                       for c in _chat(client, p, max_tokens=10, stream=True))  # fmt: skip

    with ThreadPoolExecutor(len(prompts)) as pool:
        together = dict(zip(prompts, pool.map(stream, prompts), strict=True))
    assert together == alone and len(set(alone.values())) > 1


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
    """A long generation (1,500 tokens): the client reads two events and disconnects; the
    server cancels the request (its slot is free, the count of cancelled requests grows)
    long before it could have finished."""
    before = server.request("GET", "/health")[1]["cancelled"]
    url = urlparse(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = {"prompt": "The", "max_tokens": 1500, "temperature": 0.0, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    r = conn.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data: ")
    server.wait_for(lambda h: h["active"] == 1)
    conn.sock.close()  # gone, mid-stream
    conn.close()
    server.wait_for(lambda h: h["active"] == 0 and h["cancelled"] == before + 1, 5.0)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--slots", "0"], "--slots must be an integer in [1, 1,024], got 0"),
        (["--port", "70000"], "--port must be an integer in [0, 65,535], got 70000"),
        (["--device", "tpu"], "--device must be cpu or cuda, got 'tpu'"),
        (["--api-key", " "], "--api-key is empty"),
        (["--max-tokens", "5000"], "--max-tokens must be in [1, 2048] (the model's context)"),
        (["--host", "127.0.0.1", "--port", "{taken}"], "cannot listen there"),
        (["--host", "no.such.host.invalid"], "cannot listen there"),
    ],
)  # fmt: skip
def test_bad_serve_flags_are_one_line(run, monkeypatch, capsys, flags, message):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        flags = [f.format(taken=taken.getsockname()[1]) for f in flags]
        code, _, err = run_cli(monkeypatch, capsys, "serve", "--checkpoint", str(run), *flags)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    code, _, err = run_cli(monkeypatch, capsys, "serve", "--checkpoint", str(run / "nowhere"))
    assert code == 2 and err.startswith("error: checkpoint not found")


def test_a_client_that_leaves_before_a_whole_answer_frees_its_slot(server):
    """The same for a request answered whole: the server notices within its poll (0.25 s)."""
    before = server.request("GET", "/health")[1]["cancelled"]
    url = urlparse(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = {"prompt": "The", "max_tokens": 1500, "temperature": 0.0}
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    server.wait_for(lambda h: h["active"] == 1)
    conn.sock.close()
    conn.close()
    server.wait_for(lambda h: h["active"] == 0 and h["cancelled"] == before + 1, 5.0)


def test_a_deeply_nested_body_is_a_400_naming_the_body(server):
    body = b"[" * 100_000 + b"]" * 100_000  # 200 KB: a recursive parser's stack overflows
    got, reply = server.request("POST", "/v1/chat/completions", body, KEY)
    assert got == 400 and reply["error"]["code"] == "invalid_json", reply
    assert "body" in reply["error"]["message"] and "100000 levels" in reply["error"]["message"]
    # brackets inside a string are text, not nesting
    text = {"messages": [{"role": "user", "content": "[{" * 50}], "max_tokens": 1}
    got, reply = server.request("POST", "/v1/chat/completions", text, KEY)
    assert got == 200, reply


def test_clients_that_close_mid_body_leave_no_traceback(run):
    """50 clients each send half a body and close: the console stays quiet (no traceback,
    no line per client) and the server still answers."""
    srv = Server(run, "--slots", "2")
    try:
        url = urlparse(srv.url)
        for i in range(50):
            sock = socket.create_connection((url.hostname, url.port), timeout=30)
            head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\nContent-Length: 4000\r\n\r\n")  # fmt: skip
            sock.sendall(head.encode() + b'{"messages": [{"role": "user", "content": "' + b"a" * i)
            sock.close()
        got, reply = srv.request("GET", "/health", None, None)
        assert got == 200, reply
    finally:
        srv.stop()  # a graceful stop: every request's handler has run when it returns
    assert "Traceback" not in srv.output and "ClientDisconnect" not in srv.output, srv.output
    assert len(srv.output.splitlines()) <= 3, srv.output  # the banner, uvicorn's goodbye


def test_completions_never_return_special_tokens_as_text(client, run):
    """A random model's text reaches special tokens: the end of an answer or of a document
    ends it (finish_reason stop); any other (a role) is counted but never shown, in either
    endpoint, streamed or whole."""
    from euler.serve.protocol import ending_ids, special_ids

    tok = checkpoint.load(run).tokenizer()
    assert set(ending_ids(tok)) == {tok.end_id, tok.eot_id}
    assert special_ids(tok) == set(tok.special.values())
    names = list(tok.special)
    reasons = []
    for seed in range(6):
        kw = dict(model=MODEL, prompt="The", max_tokens=400, temperature=1.5, seed=seed)
        text = client.completions.create(**kw)
        chunks = client.completions.create(**kw, stream=True)
        streamed = "".join(c.choices[0].text for c in chunks)
        assert streamed == text.choices[0].text
        chat = _chat(client, "Say sun.", max_tokens=400, seed=seed)
        for got, why in (
            (text.choices[0].text, text.choices[0].finish_reason),
            (chat.choices[0].message.content, chat.choices[0].finish_reason),
        ):
            assert not [n for n in names if n in got], got
            reasons.append(why)
    assert "stop" in reasons  # an end token was reached, and ended the answer
    # greedy from "The" emits <|user|> at once: counted, not shown, and the text goes on
    greedy = client.completions.create(model=MODEL, prompt="The", max_tokens=40, temperature=0)
    assert greedy.usage.completion_tokens == 40 and "<|" not in greedy.choices[0].text


def test_one_access_log_line_a_request_and_none_with_quiet(run):
    """Method, path, status, completion tokens (where the model ran) and milliseconds, for
    a whole and a streamed answer, an error and /health; --quiet logs none of them."""
    import re

    for flags, logged in (((), True), (("--quiet",), False)):
        srv = Server(run, "--slots", "2", *flags)
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
            whole = client.completions.create(model="run", prompt="The", max_tokens=5,
                                              temperature=0)  # fmt: skip
            list(client.completions.create(model="run", prompt="The", max_tokens=5,
                                           temperature=0, stream=True))  # fmt: skip
            srv.request("GET", "/health", None, None)
            srv.request("POST", "/v1/completions", {"prompt": 3}, None)
        finally:
            srv.stop()
        lines = [x for x in srv.output.splitlines() if re.match(r"(GET|POST) /", x)]
        if not logged:
            assert lines == [], srv.output
            continue
        n = whole.usage.completion_tokens
        assert [re.sub(r" \d+ ms$", " ms", x) for x in lines] == [
            f"POST /v1/completions 200 {n} tokens ms",
            f"POST /v1/completions 200 {n} tokens ms",
            "GET /health 200 ms",
            "POST /v1/completions 400 ms",
        ], srv.output
