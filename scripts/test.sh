#!/usr/bin/env bash
# The whole test set-up on a fresh Debian machine, then the suite: the test extras, Debian's
# chromium and its driver (the chat page's browser test), then pytest. Arguments go to
# pytest (`scripts/test.sh -m slow`, `scripts/test.sh tests/test_pipeline.py`).
# EULER_NO_BROWSER=1 skips the browser and its test.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
# about a minute for apt-get update and the install; skipped when both are there already
if [ "${EULER_NO_BROWSER:-}" != 1 ] && { ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; }; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
exec python3 -m pytest -q "$@"
