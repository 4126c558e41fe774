"""`ToolUse`: the part of `LocalBackend` that gives its chat tools from MCP servers.

The servers (`localfab.mcp.servers.ToolServers`) run on a loop of their own; a call runs in the
screen's worker, never on the engine thread. What reaches the chat session (the tools it
offers, a result, the reply that follows) goes through the engine thread as every reply does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from localfab.tui.backend import (
    ReplyEvent,
    ServerExtra,
    ToolCallShown,
    ToolResultShown,
    ToolServerRow,
)
from localfab.tui.engine_thread import EngineThread, on_engine, streamed_on_engine

if TYPE_CHECKING:
    from localfab.chat.session import ChatSession
    from localfab.chat.tools import ToolRequest
    from localfab.engine.types import GenerationOptions
    from localfab.mcp.approvals import Approvals
    from localfab.mcp.servers import ToolServers

# Rounds of calls one message may lead to when the config does not say.
DEFAULT_TOOL_ROUNDS = 5
# Characters a result may take per token of room left in the window (a cautious estimate:
# JSON and code run about three characters to a token).
CHARS_PER_TOKEN = 3


class ToolUse:
    """Tools for the backend's chat: which servers this chat uses, approvals, calls."""

    servers: ToolServers | None
    approvals: Approvals | None
    max_tool_rounds: int
    tools_problem: str
    options: Any  # LocalBackend's ChatOptions (tool_choice, reply_reserve)
    engine_thread: EngineThread
    _tool_request: ToolRequest | None
    _loaded: Any  # LocalBackend's loaded model (None: none yet)
    # The servers this chat uses, the tools each had when they were offered (a server whose
    # list changed since is offered again), and why a server's tools were not offered.
    # Each is replaced as a whole, never changed in place.
    _servers_used: tuple[str, ...] = ()
    _offered: dict[str, tuple[Any, ...]] = {}
    _refused: dict[str, str] = {}

    # LocalBackend's own:
    def _chat(self) -> ChatSession:
        raise NotImplementedError

    def _events(self, events: Iterator[Any]) -> Iterator[ReplyEvent]:
        raise NotImplementedError

    def _reply_options(self, cancel: threading.Event) -> GenerationOptions:
        raise NotImplementedError

    def tool_servers(self) -> list[ToolServerRow]:
        if self.servers is None:
            return []
        in_use = self._servers_in_use()
        return [
            ToolServerRow(
                s.config.name,
                s.config.target,
                s.status if s.config.enabled else "turned off",
                self._refused.get(s.config.name) or s.error,
                tuple(t.name for t in s.tools),
                s.config.name in in_use,
            )
            for s in self.servers.states()
        ]

    def _servers_in_use(self) -> set[str]:
        from localfab.mcp.servers import split_name

        request = self._tool_request
        if request is None:
            return set()
        return {split_name(t["function"]["name"])[0] for t in request.tools}

    def use_servers(self, names: list[str]) -> list[ToolServerRow]:
        """Start the named servers and offer their tools to this chat (a server that fails
        to start, or whose tools the window cannot hold, is left out, with why in its row)."""
        from localfab.mcp.servers import ToolServerError

        for name in names if self.servers is not None else []:
            try:
                self.servers.tools([name])  # type: ignore[union-attr]
            except ToolServerError:
                continue  # its row says why
        self._servers_used = tuple(names)
        self._offer_servers()
        return self.tool_servers()

    @on_engine
    def _offer_servers(self) -> None:
        """On the engine thread: the tool request of the servers in use, each server's tools
        measured against the window first. Tools that cannot fit are refused at once, in one
        line, rather than found out while every reply's prompt is built (5,000 tools from one
        server would be thousands of tokenizations, each a request to a remote server)."""
        from localfab.chat.fitting import reply_reserve_for
        from localfab.chat.tools import parse_tools, tools_tokens
        from localfab.errors import UsageError

        engine = getattr(self._loaded, "engine", None) if self._loaded is not None else None
        n_ctx = int(getattr(engine, "n_ctx", 0) or 0)
        room = n_ctx - reply_reserve_for(n_ctx, self.options.reply_reserve)

        def tokenize(text: str) -> list[int]:
            assert engine is not None
            return list(engine.tokenize(text, add_special=False, parse_special=True))

        offered: dict[str, tuple[Any, ...]] = {}
        refused: dict[str, str] = {}
        definitions: list[dict[str, Any]] = []
        used = 0
        for name in self._servers_used if self.servers is not None else ():
            state = self.servers.state(name)  # type: ignore[union-attr]
            offered[name] = state.tools
            found = [t.definition() for t in state.tools]
            if not found:
                continue
            try:
                parse_tools(found)
            except UsageError as exc:
                refused[name] = f"its tools cannot be offered: {exc}"
                continue
            if engine is not None:
                tokens, exact = tools_tokens(found, tokenize, room - used)
                if used + tokens > room:
                    about = "" if exact else "~"
                    refused[name] = (
                        f"the {len(found):,} tools of {name} take {about}{tokens:,} tokens, "
                        f"more than the {max(0, room - used):,} the window of {n_ctx:,} "
                        f"has for them: turn some off with tools = [...] under "
                        f"[mcp.servers.{name}] in config.toml, or use a larger context (-c)"
                    )
                    continue
                used += tokens
            definitions += found
        self._offered, self._refused = offered, refused
        choice = self.options.tool_choice
        self._tool_request = parse_tools(definitions, choice) if definitions else None

    def tool_rounds(self) -> int:
        return self.max_tool_rounds

    def _offer_tools(self, chat: ChatSession, *, last_round: bool = False) -> None:
        """On the engine thread: the chat's tools for its next reply (none in a last round);
        a server whose tool list changed since has its tools offered as they are now."""
        if self._tool_request is not None and self._listed_again():
            self._offer_servers()
        request = self._tool_request
        if request is not None and last_round:
            request = replace(request, choice="none")
        if chat.tools != request:
            chat.set_tools(request)

    def _listed_again(self) -> bool:
        """Whether a server in use has listed its tools again since they were offered."""
        servers = self.servers
        return servers is not None and any(
            servers.state(name).tools is not tools for name, tools in self._offered.items()
        )

    def always_allowed(self, name: str) -> bool:
        """Whether the person always allows `name` as its server defines it now (its tools
        are listed again: a changed definition is asked about again)."""
        from localfab.mcp.servers import split_name

        if self.servers is None or self.approvals is None:
            return False
        server, _ = split_name(name)
        if server not in self.servers.names():
            return False
        tool = next((t for t in self.servers.refresh(server) if t.qualified == name), None)
        return tool is not None and self.approvals.allows(tool)

    def allow_always(self, name: str) -> None:
        tool = self._tool_info(name)
        if tool is not None and self.approvals is not None:
            self.approvals.allow(tool)

    def _tool_info(self, name: str) -> Any:
        from localfab.mcp.servers import split_name

        if self.servers is None:
            return None
        server, _ = split_name(name)
        if server not in self.servers.names():
            return None
        return next((t for t in self.servers.state(server).tools if t.qualified == name), None)

    def run_tool(self, call: ToolCallShown, cancel: threading.Event) -> ToolResultShown:
        if self.servers is None:
            return ToolResultShown("No MCP server is configured for this chat.", "crashed")
        if not isinstance(call.arguments, dict):
            return ToolResultShown(
                f"The arguments were not a JSON object: {call.arguments!r}", "error"
            )
        room = self._room_for_result()
        outcome = self.servers.call(
            call.name,
            call.arguments,
            cancel=cancel,
            max_chars=max(200, room * CHARS_PER_TOKEN),
        )
        return ToolResultShown(outcome.text, outcome.kind, outcome.full_chars)

    @on_engine
    def _room_for_result(self) -> int:
        return self._chat().room_for_result()

    @on_engine
    def add_tool_result(self, call: ToolCallShown, result: ToolResultShown) -> None:
        from localfab.chat.toolturns import ToolCallMade

        made = ToolCallMade(call.id, call.name, call.arguments)
        self._chat().add_tool_result(made, result.text, kind=result.kind)

    @streamed_on_engine
    def follow_up(self, *, last_round: bool, cancel: threading.Event) -> Iterator[ReplyEvent]:
        chat = self._chat()
        options = self._reply_options(cancel)
        self._offer_tools(chat, last_round=last_round)
        yield from self._events(chat.follow_up(options))

    def server_extras(self) -> list[ServerExtra]:
        if self.servers is None:
            return []
        in_use = self._servers_in_use()
        return [e for s in self.servers.states() if s.config.name in in_use for e in s.extras]

    def fetch_extra(self, extra: ServerExtra, arguments: dict[str, str]) -> str:
        from localfab.mcp.servers import ToolServerError

        if self.servers is None:
            raise ToolServerError("no MCP server is configured")
        return self.servers.fetch(extra, arguments)

    def close_tools(self) -> None:
        """Stop every server (the app quits): no process outlives it."""
        if self.servers is not None:
            self.servers.close()
