"""Project Gutenberg header/footer stripping: both marker styles, wrapped markers, CRLF."""

from __future__ import annotations

from pathlib import Path

import pytest

from euler.data.gutenberg import book_urls, strip_gutenberg

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

OLD_STYLE = (
    "The Project Gutenberg EBook of Tiny, by Someone\r\n"
    "This eBook is for the use of anyone anywhere at no cost\r\n\r\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK TINY ***\r\n\r\n\r\n\r\n"
    "Produced by A Volunteer\r\nand Friends\r\n\r\n\r\n"
    "CHAPTER I\r\n\r\nIt was a dark night.\r\n\r\n"
    "End of Project Gutenberg’s Tiny, by Someone\r\n\r\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK TINY ***\r\n\r\n"
    "***** This file should be named 1.txt *****\r\n"
    "*** START: FULL LICENSE ***\r\nTHE FULL PROJECT GUTENBERG LICENSE\r\n"
)
NEW_STYLE = (
    "Project Gutenberg's Tiny Two\r\n\r\n"
    "***START OF THE PROJECT GUTENBERG EBOOK THE LIFE AND ADVENTURES OF\r\n"
    "A VERY LONG TITLE (1808)***\r\n\r\n"
    "Body line one.\r\nBody line two.\r\n\r\n\r\n"
    "***END OF THE PROJECT GUTENBERG EBOOK THE LIFE AND ADVENTURES OF A VERY\r\n"
    "LONG TITLE (1808)***\r\n\r\nUpdated editions will replace the previous one.\r\n"
)


def test_old_style_markers_credit_and_end_line():
    assert strip_gutenberg(OLD_STYLE) == "CHAPTER I\n\nIt was a dark night."


def test_new_style_marker_wrapped_over_two_lines():
    assert strip_gutenberg(NEW_STYLE) == "Body line one.\nBody line two."


def test_text_without_markers_is_kept_whole():
    assert strip_gutenberg("  My own text.\r\nSecond line.\r\n") == "My own text.\nSecond line."


def test_book_urls():
    urls = book_urls(1342, mirror="http://127.0.0.1:1/")
    assert urls[0] == "http://127.0.0.1:1/cache/epub/1342/pg1342.txt"
    assert all("1342" in u for u in urls)


@pytest.mark.skipif(not (SHARED / "books").is_dir(), reason="shared/data/books not present")
def test_every_shared_book_loses_header_and_footer():
    books = sorted((SHARED / "books").glob("*.txt"))
    assert len(books) > 100
    for path in books:
        raw = path.read_text(encoding="utf-8")
        body = strip_gutenberg(raw)
        assert "\r" not in body, path.name
        upper = body.upper()
        for marker in ("START OF THE PROJECT GUTENBERG", "START OF THIS PROJECT GUTENBERG"):
            assert marker not in upper, path.name
            assert marker.replace("START", "END") not in upper, path.name
        assert "FULL PROJECT GUTENBERG LICENSE" not in body, path.name
        assert 2_000 < len(body) < len(raw) - 10_000, path.name  # the license alone is ~18 kB
