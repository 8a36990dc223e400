#!/usr/bin/env bash
# The wheels a lent H200 lacks, into .whl/ (ignored by git; carry it: carry [".whl"]), for
# Python 3.12 on x86-64: numpy 2.3.5 (the image's 2.5 breaks numba-cuda) and rouge-score with
# nltk (euler eval --instructions; rouge-score ships only a source archive, so it is built
# into a wheel here). Arguments add more: `duckdb` (25 MB: web-text preparation, and
# collecting the test files that import it), `serve` (FastAPI, uvicorn and their needs, at
# the versions tested here: 3 MB, for euler serve), or any other NAME==VERSION.
# h200_session.sh installs whatever .whl holds.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$p")
done
extra=()
for a in "$@"; do
    if [ "$a" = serve ]; then
        extra+=(fastapi==0.165.0 uvicorn==0.54.0 starlette==1.10.0 pydantic==2.13.4
            pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 h11==0.16.0
            anyio==4.16.0 sniffio==1.3.1 typing-extensions==4.16.0 annotated-doc==0.0.7
            opentelemetry-api==1.45.2)
    else
        extra+=("$a")
    fi
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl numpy==2.3.5 "${extra[@]}"
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl nltk
python3 -m pip wheel -q --no-deps -w .whl rouge-score
ls .whl
