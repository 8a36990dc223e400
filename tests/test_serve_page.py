"""The chat page at / in a real browser: Debian's chromium, headless, driven by Selenium
through Debian's chromedriver (nothing downloaded at run time). It loads the page, enters
the API key, sends a message and watches the answer stream in, stops a long answer, and
starts a new chat; the greedy answer on the page is the API's answer to the same message.

Without chromium and chromedriver the test fails, naming what to install (scripts/test.sh,
the README's test command that .ci/run runs, installs them), unless EULER_NO_BROWSER=1 says
this machine has no browser on purpose: a missing browser never passes silently.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from tests.serve_helpers import (  # noqa: E402
    Server,
    headless_chromium,
    set_field,
    tiny_checkpoint,
    until,
)

KEY = "page-key"
MODEL = "tiny-page"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # a context of 8192: a long answer streams for seconds, time enough to stop it
    run = tiny_checkpoint(tmp_path_factory.mktemp("page") / "run", context=8192)
    srv = Server(run, "--api-key", KEY,
                 "--model-name", MODEL)  # fmt: skip
    yield srv
    srv.stop()
    assert "Traceback" not in srv.output, srv.output


@pytest.fixture(scope="module")
def browser():
    driver = headless_chromium()
    yield driver
    driver.quit()


def test_the_page_streams_an_answer_stops_and_starts_over(browser, server):
    d = browser
    d.get(server.url + "/")
    assert d.title == "euler chat"
    set_field(d, "api_key", KEY)
    d.find_element("id", "temperature").click()  # the key field's change event fires
    until(lambda: d.find_element("id", "model").text == MODEL, what="the model's name")
    answer = 'return [...document.querySelectorAll(".msg.assistant")].map(e => e.textContent)'

    # a short greedy answer: what the API answers to the same message
    set_field(d, "temperature", "0")
    set_field(d, "max_tokens", "12")
    set_field(d, "prompt", "Say dog twice.")
    d.find_element("id", "send").click()
    until(lambda: d.find_elements("css selector", ".meta"), what="the answer's end")
    want = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say dog twice."}], "temperature": 0,
        "max_tokens": 12}, KEY)[1]["choices"][0]["message"]["content"]  # fmt: skip
    assert d.execute_script(answer) == [want] and want
    # the footer says the model finished, and why: "stopped" is kept for the Stop button
    (meta,) = [m.text for m in d.find_elements("css selector", ".meta")]
    assert meta.startswith(("finished (stop) \u00b7 ", "finished (length: ")), meta
    assert "prompt + " in meta and "stopped" not in meta, meta

    # a long answer streams in piece by piece until Stop ends it
    set_field(d, "max_tokens", "8000")
    set_field(d, "prompt", "Tell me a long story.")
    d.find_element("id", "send").click()
    seen = set()

    def growing() -> bool:
        texts = d.execute_script(answer)
        if len(texts) == 2 and texts[1]:
            seen.add(len(texts[1]))
        return len(seen) >= 2

    until(growing, what="two lengths of the streamed answer")
    assert d.find_element("id", "stop").is_enabled()
    assert not d.find_element("id", "send").is_enabled()
    d.find_element("id", "stop").click()
    until(lambda: d.find_element("id", "send").is_enabled(), what="the stream to stop")
    metas = [m.text for m in d.find_elements("css selector", ".meta")]
    assert metas[-1] == "stopped" and len(metas) == 2
    server.wait_for(lambda h: h["active"] == 0 and h["cancelled"] == 1)

    d.find_element("id", "new-chat").click()
    assert d.execute_script(answer) == [] and d.find_element("id", "empty").is_displayed()
