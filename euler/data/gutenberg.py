"""Project Gutenberg plain-text books: strip the header and footer, normalise newlines.

Both marker styles found in ../shared/data/books are handled:

    *** START OF THIS PROJECT GUTENBERG EBOOK TITLE ***     (older files)
    ***START OF THE PROJECT GUTENBERG EBOOK TITLE***        (newer files)

A marker may wrap onto the next line (long titles), so a marker runs from its
`***` to the closing `***`. The body is what lies between the start marker and the
end marker; the older files' "End of Project Gutenberg's ..." line just above the
end marker is dropped too, and so is a leading producer credit paragraph
("Produced by ...", "E-text prepared by ..."). The oldest "*END*THE SMALL PRINT!" header is accepted
as a start marker. A text with no start marker is kept whole (it is not a PG file).
"""

from __future__ import annotations

import re

START = re.compile(
    r"^\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK.*?\*\*\*[^\n]*\n"
    r"|^\*END\*THE SMALL PRINT![^\n]*\n",
    re.IGNORECASE | re.MULTILINE | re.DOTALL,
)
END = re.compile(
    r"^\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK"
    r"|^End of (?:the )?Project Gutenberg(?:'s|’s)? ",
    re.IGNORECASE | re.MULTILINE,
)
CREDIT = re.compile(
    r"^(?:Produced by|E-?text prepared by|This e-?text was (?:produced|prepared) by|"
    r"Transcribed from)[^\n]*(?:\n[^\n]+)*\n*",
    re.IGNORECASE,
)
BOOK_URLS = (  # tried in order; {n} is the ebook number
    "{mirror}/cache/epub/{n}/pg{n}.txt",
    "{mirror}/files/{n}/{n}-0.txt",
)
DEFAULT_MIRROR = "https://www.gutenberg.org"


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR become LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_gutenberg(text: str) -> str:
    """The body of a Project Gutenberg text: header, footer and license removed, LF newlines."""
    text = normalize_newlines(text)
    start = START.search(text)
    if start is None:
        return text.strip()
    body = text[start.end() :]
    end = END.search(body)
    if end is not None:
        body = body[: end.start()]
    return CREDIT.sub("", body.strip(), count=1).strip()


def book_urls(number: int, mirror: str = DEFAULT_MIRROR) -> list[str]:
    """Candidate URLs of ebook `number`'s UTF-8 plain text, most likely first."""
    return [u.format(mirror=mirror.rstrip("/"), n=number) for u in BOOK_URLS]
