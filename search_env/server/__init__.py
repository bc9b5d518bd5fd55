"""This project's retrieval server: any Source over the HTTP API of Search-R1 / FlashRAG retrieval
servers (``POST /retrieve``), plus ``GET /health``, with cross-request micro-batching. The server
answers (503, "building") while its index is built (:class:`SourceBuild`).

Start one from the shell with ``python -m search_env.server --corpus PATH --retriever bm25`` (see
``--help``), or in-process with :class:`RetrievalServer`. Query one with
:class:`search_env.sources.remote.RemoteSource` or any Search-R1-style client.
"""
from search_env.server.app import RetrieveRequest, ServerLimits, create_app
from search_env.server.batching import MicroBatcher
from search_env.server.readiness import SourceBuild, SourceBuildFailed
from search_env.server.runner import RetrievalServer, serve

__all__ = ["MicroBatcher", "RetrievalServer", "RetrieveRequest", "ServerLimits", "SourceBuild", "SourceBuildFailed", "create_app", "serve"]
