"""A screenshot of `euler serve`'s chat page after a short conversation, for docs/.

    python bench/serve_screenshot.py --checkpoint RUN --out docs/serve-chat.png

Starts `euler serve` on a free loopback port, opens the page in Debian's headless
chromium (Selenium, Debian's chromedriver), sends each --message in turn with the given
sampling settings, waits for each answer's end, and saves the window as a PNG.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="PNG to write.")
    ap.add_argument("--message", action="append", help="A user message (repeat for more).")
    ap.add_argument("--temperature", default="0.7")
    ap.add_argument("--seed", default="3")
    ap.add_argument("--size", default="1100,760", help="Window width,height in pixels.")
    args = ap.parse_args()
    messages = args.message or ["Give three tips for staying healthy.",
                                "Describe a sunny day at the beach."]  # fmt: skip
    cmd = [sys.executable, "-m", "euler.cli", "serve", "--checkpoint", str(args.checkpoint),
           "--port", "0"]  # fmt: skip
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in server.stdout:
        if line.startswith("serving "):
            url = line.split(" at ")[1].split()[0]
            break
    if url is None:
        raise SystemExit(f"euler serve did not start (exit {server.wait()})")
    threading.Thread(target=server.stdout.read, daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={args.size}",
                "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        driver.get(url)
        for field, value in (("temperature", args.temperature), ("seed", args.seed)):
            el = driver.find_element("id", field)
            el.clear()
            el.send_keys(value)
        for i, text in enumerate(messages):
            driver.find_element("id", "prompt").send_keys(text)
            driver.find_element("id", "send").click()
            deadline = time.monotonic() + 60
            while len(driver.find_elements("css selector", ".meta")) <= i:
                if time.monotonic() > deadline:
                    raise SystemExit("no answer within 60 s")
                time.sleep(0.05)
        tmp = args.out.with_name(args.out.name + ".tmp.png")  # a whole file or none
        driver.save_screenshot(str(tmp))
        tmp.replace(args.out)
        print(f"wrote {args.out}")
    finally:
        driver.quit()
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
