"""The retrieval API of Search-R1 / FlashRAG servers, as :class:`~search_env.sources.remote.RemoteSource`
sends it and this project's own server (:mod:`search_env.server`) answers it: documents and passages,
replies read into passages, and the ``/retrieve`` URLs of one or several replicas.

The API (the same one this project's own server, :mod:`search_env.server`, speaks)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "7", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}

One inner list per query, best first. ``contents`` is the wiki-18 layout: the title in double quotes on
the first line, the passage text after the first newline. With ``"return_scores": false`` each inner
list holds the bare document objects instead of ``{"document", "score"}`` pairs. A missing, null or 0
``topk`` means the server's default.
"""
from __future__ import annotations

from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

from search_env.data.corpus import split_wiki18_contents
from search_env.sources.base import Passage

__all__ = ["document_to_passage", "format_contents", "parse_retrieve_response", "passage_to_document", "replica_urls"]


def format_contents(title: str, text: str) -> str:
    """Write a passage as wiki-18 ``contents``: ``"title"`` on the first line, then the text.

    Newlines inside the title become spaces, because clients split ``contents`` on the first
    newline to recover the title.
    """
    one_line_title = " ".join(title.splitlines())
    return f'"{one_line_title}"\n{text}'


def passage_to_document(passage: Passage) -> dict[str, str]:
    """The ``document`` object of the API for a passage: ``{"id", "contents"}``, as a wiki-18 corpus row."""
    return {"id": passage.id, "contents": format_contents(passage.title, passage.text)}


def document_to_passage(document: Any, score: Any = 0.0) -> Passage:
    """Read one ``document`` object (wiki-18 ``{id, contents}`` or ``{id, title, text}``) as a Passage.

    Raises ValueError with the reason when the object has neither layout. A document without an
    ``id`` (Search-R1's BM25 server omits it) gets its title as id, so passages stay distinguishable.
    """
    if not isinstance(document, dict):
        raise ValueError(f"a document must be a JSON object, got {type(document).__name__}")
    if isinstance(document.get("contents"), str):
        title, text = split_wiki18_contents(document["contents"])
    elif isinstance(document.get("title"), str) and isinstance(document.get("text"), str):
        title, text = document["title"], document["text"]
    else:
        raise ValueError(f"a document needs a string 'contents' (or 'title' and 'text'), got keys {sorted(document)}")
    doc_id = document.get("id", title)
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise ValueError(f"a document id must be a string or an integer, got {type(doc_id).__name__}")
    if isinstance(score, bool) or not isinstance(score, (int, float, str)):
        raise ValueError(f"a score must be a number, got {type(score).__name__}")
    try:
        value = float(score)
    except ValueError:
        raise ValueError(f"a score must be a number, got {score!r}") from None
    return Passage(id=str(doc_id), title=title, text=text, score=value)


def parse_retrieve_response(payload: Any, n_queries: int) -> list[list[Passage]]:
    """Turn a ``/retrieve`` reply into one passage list per query; ValueError says what is malformed.

    Accepts both layouts (``{"document", "score"}`` entries and bare documents), so the client also
    works against servers that ignore ``return_scores``.
    """
    if not isinstance(payload, dict) or "result" not in payload:
        raise ValueError("the reply is not a JSON object with a 'result' field")
    result = payload["result"]
    if not isinstance(result, list) or len(result) != n_queries:
        got = f"{len(result)} lists" if isinstance(result, list) else type(result).__name__
        raise ValueError(f"'result' must hold one list per query ({n_queries}), got {got}")
    passages: list[list[Passage]] = []
    for i, entries in enumerate(result):
        if not isinstance(entries, list):
            raise ValueError(f"result[{i}] must be a list, got {type(entries).__name__}")
        row = []
        for j, entry in enumerate(entries):
            try:
                if isinstance(entry, dict) and "document" in entry:
                    row.append(document_to_passage(entry["document"], entry.get("score", 0.0)))
                else:
                    row.append(document_to_passage(entry))
            except ValueError as exc:
                raise ValueError(f"result[{i}][{j}]: {exc}") from None
        passages.append(row)
    return passages


def _retrieve_url(url: str) -> str:
    """Accept a server's base URL or its full ``/retrieve`` URL (what Search-R1 configs hold)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"RemoteSource needs an http(s) URL such as http://127.0.0.1:8000/retrieve, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/retrieve")
    return urlunsplit(parts)


def replica_urls(url: str | Sequence[str]) -> list[str]:
    """The ``/retrieve`` URLs of one or several replicas: a URL, a comma-separated string of URLs (what
    a command-line flag or a config value holds) or a list of URLs. ValueError when there is none, one
    is not an http(s) URL, or one repeats."""
    pieces = url.split(",") if isinstance(url, str) else list(url)
    if not all(isinstance(piece, str) for piece in pieces):
        raise ValueError(f"RemoteSource needs a URL, comma-separated URLs or a list of URLs, got {url!r}")
    urls = [_retrieve_url(piece.strip()) for piece in pieces if piece.strip()]
    if not urls:
        raise ValueError("RemoteSource needs at least one server URL")
    repeated = sorted({u for u in urls if urls.count(u) > 1})
    if repeated:
        raise ValueError(f"the replica URLs repeat {', '.join(repeated)}")
    return urls
