"""An MCP server with one ``search`` tool: BM25 over the built-in synthetic world, or over a corpus jsonl.

It shows what :class:`search_env.sources.mcp.MCPSource` expects of a server: a tool that takes a query
and a number of passages and returns them as ``{id, title, text, score}`` objects (a server whose tool
returns plain text works too; each text block becomes a passage)::

    python examples/mcp_search_server.py                                  # stdio, the synthetic world
    python examples/mcp_search_server.py --corpus wiki.jsonl --transport streamable-http --port 8765

and, in Python, the environment searches it as a source named ``wiki``::

    from search_env.sources.mcp import MCPSource
    source = MCPSource([sys.executable, "examples/mcp_search_server.py"], name="wiki")  # or url="http://127.0.0.1:8765/mcp"

Needs the ``mcp`` extra (``pip install -e '.[mcp]'``).
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from mcp.server.mcpserver import MCPServer

from search_env.sources.base import Source
from search_env.sources.bm25 import BM25Source
from search_env.synthetic import generate_world


def search_server(source: Source, *, log_level: str = "WARNING") -> MCPServer:
    """An MCP server whose ``search`` tool answers one query from ``source``."""
    server = MCPServer("searchqa-search", log_level=log_level)

    @server.tool()
    def search(query: str, k: int = 3) -> list[dict[str, object]]:
        """The ``k`` passages that best match ``query``, best first, as {id, title, text, score}."""
        passages = source.search([query], k)[0]
        return [{"id": p.id, "title": p.title, "text": p.text, "score": p.score} for p in passages]

    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", help="a corpus jsonl ({id, title, text} or {id, contents}); default: the synthetic world")
    parser.add_argument("--seed", type=int, default=0, help="the synthetic world's seed (without --corpus)")
    parser.add_argument("--difficulty", type=int, default=1, help="the synthetic world's difficulty (without --corpus)")
    parser.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="with --transport streamable-http")
    parser.add_argument("--port", type=int, default=8765, help="with --transport streamable-http; the tool is at /mcp")
    args = parser.parse_args(argv)
    passages = args.corpus if args.corpus else generate_world(seed=args.seed, n_questions=0, difficulty=args.difficulty).passages()
    server = search_server(BM25Source(passages, name="wiki"))
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
