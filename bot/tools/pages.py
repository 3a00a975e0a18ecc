"""What a fetched page's bytes become: its kind (by content type or by sniffing), its
text (decoded with the declared or the page's own charset), and HTML as plain text."""

from __future__ import annotations

import codecs
import re
from html.parser import HTMLParser

# -- text extraction ------------------------------------------------------------------

SKIP = frozenset({"script", "style", "noscript", "template", "svg", "math", "iframe",
                  "object", "canvas", "select", "button"})
BLOCK = frozenset({
    "address", "article", "aside", "blockquote", "body", "dd", "details", "dialog", "div",
    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "header", "hgroup",
    "hr", "html", "legend", "main", "nav", "ol", "p", "pre", "section", "summary", "table",
    "tbody", "thead", "tfoot", "title", "tr", "ul", "caption", "center",
})
HEADINGS = {f"h{n}": n for n in range(1, 7)}
_WS = re.compile(r"\s+")


class TextExtractor(HTMLParser):
    """HTML to readable text: blocks on their own lines, scripts and styles dropped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0
        self.pre = 0
        self.breaks = 0
        """Line breaks at the end of the text so far."""

    def emit(self, text: str) -> None:
        self.out.append(text)
        stripped = text.rstrip("\n")
        self.breaks = len(text) - len(stripped) + (self.breaks if not stripped else 0)

    def newline(self, count: int = 1) -> None:
        """End the line (with `count - 1` blank lines after it), once, however many blocks
        end or start here."""
        if not self.out or self.breaks >= count:
            return
        if not self.breaks:
            self.out[-1] = self.out[-1].rstrip(" ")
        self.emit("\n" * (count - self.breaks))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in SKIP:
            self.skip += 1
        elif tag == "br":
            self.newline()
        elif tag in HEADINGS:
            self.newline(2)
            self.emit("#" * HEADINGS[tag] + " ")
        elif tag == "li":
            self.newline()
            self.emit("- ")
        elif tag in ("td", "th"):
            if not self.breaks and self.out:
                self.emit(" ")
        elif tag in BLOCK:
            self.newline(2 if tag in ("p", "pre", "table", "blockquote") else 1)
            self.pre += tag == "pre"
        elif tag == "img":
            alt = dict(attrs).get("alt")
            if alt and not self.skip:
                self.handle_data(f" {alt} ")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in HEADINGS or tag in BLOCK or tag == "li":
            self.newline(2 if tag in HEADINGS or tag in ("p", "pre", "table") else 1)
            if tag == "pre":
                self.pre = max(0, self.pre - 1)

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.pre:
            self.emit(data)
            return
        text = _WS.sub(" ", data)
        if self.breaks or not self.out or self.out[-1].endswith(" "):
            text = text.lstrip(" ")
        if text:
            self.emit(text)

    def text(self) -> str:
        joined = "".join(self.out)
        lines = [line.rstrip() for line in joined.split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def html_to_text(html: str) -> str:
    parser = TextExtractor()
    parser.feed(html)
    parser.close()
    return parser.text()


# -- content types --------------------------------------------------------------------

TEXT_TYPES = frozenset({
    "application/json", "application/xml", "application/javascript", "application/ecmascript",
    "application/x-javascript", "application/x-yaml", "application/yaml", "application/toml",
    "application/x-ndjson", "application/sql", "application/x-sh", "application/csv",
    "application/rss+xml", "application/atom+xml",
})
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
BINARY_PREFIXES = ("image/", "audio/", "video/", "font/", "model/")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9._:-]+)""",
                           re.IGNORECASE)


def classify(content_type: str | None) -> str:
    """"html", "text", "binary" or "sniff" (unknown: decide from the bytes)."""
    if not content_type:
        return "sniff"
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime in HTML_TYPES:
        return "html"
    if mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith(("+json", "+xml")):
        return "text"
    if mime.startswith(BINARY_PREFIXES) or mime.startswith("application/"):
        return "binary" if mime != "application/octet-stream" else "sniff"
    return "sniff"


def looks_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return True
    return False


def looks_html(head: bytes) -> bool:
    start = head.lstrip()[:15].lower()
    return start.startswith((b"<!doctype html", b"<html"))


def decode(body: bytes, charset: str | None, html: bool) -> str:
    if not charset and html:
        meta = _META_CHARSET.search(body[:4096])
        charset = meta.group(1).decode("ascii") if meta else None
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


