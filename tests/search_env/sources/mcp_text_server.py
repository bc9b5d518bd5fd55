"""An MCP server for MCPSource's tests, run as ``python mcp_text_server.py DELAY_S``: its ``search`` tool
waits ``DELAY_S`` seconds (asynchronously, so calls in flight together overlap) and answers in plain text
blocks, not documents; its ``broken`` tool always fails."""
from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("text-search", log_level="WARNING")


@server.tool()
async def search(query: str, k: int = 3) -> list[str]:
    """``k`` lines of text about ``query``, after the delay."""
    await asyncio.sleep(float(sys.argv[1]))
    return [f"hit {rank} for {query}" for rank in range(1, k + 1)]


@server.tool()
def broken(query: str, k: int = 3) -> str:
    """Fails, as a tool whose backend is down does (a ToolError: the SDK passes its message on)."""
    raise ToolError(f"the index behind this tool is offline\n(query {query!r})")


if __name__ == "__main__":
    server.run("stdio")
