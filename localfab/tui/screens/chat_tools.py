"""Tools in the chat screen: which MCP servers a chat uses, a card for each call the model
makes (nothing runs before the person allows it, unless they chose "always" for that tool),
the calls run in a worker (Esc stops one), the results shown as cards and handed back to the
model, which goes on, for at most `tool_rounds` rounds per message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from textual import on, work
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Input

from localfab.errors import LocalfabError
from localfab.textsafe import visible_controls
from localfab.tui.backend import ReplyFinished, ServerExtra, ToolResultShown, UsesTools
from localfab.tui.screens.chat_parts import ChatHost, ListedCommands
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.prompt_args import PromptArgsScreen
from localfab.tui.widgets.tool_cards import ToolCallCard, ToolResultCard, ToolsScreen

# The most calls of one reply that are asked about; the rest are denied, and the model is told.
MAX_CALLS = 8


@dataclass
class ToolRound:
    """The calls of one reply, waiting for the person's answers, then running."""

    cards: list[ToolCallCard]
    number: int
    cancel: threading.Event = field(default_factory=threading.Event)
    running: bool = False


class CallDone(Message):
    """A call's result (from the worker that ran it)."""

    def __init__(self, card: ToolCallCard, result: ToolResultShown) -> None:
        super().__init__()
        self.card, self.result = card, result


class RoundDone(Message):
    """Every call of a round has its result."""

    def __init__(self, current: ToolRound) -> None:
        super().__init__()
        self.round = current


class ToolActions(ChatHost):
    """Tool calls in the chat, asked about, run and fed back."""

    _tool_round: ToolRound | None = None
    _rounds_this_message = 0

    def _tools(self) -> UsesTools | None:
        backend = self.backend
        return backend if isinstance(backend, UsesTools) else None

    def tools_backend(self) -> UsesTools | None:
        """The backend, where it can call tools (None otherwise)."""
        return self._tools()

    # --- prompts and resources ----------------------------------------------------------------

    def use_extra(self, extra: ServerExtra) -> None:
        """A server's prompt (its arguments asked first) into the prompt box, or a resource
        attached to the message being written."""
        if extra.kind == "prompt" and extra.arguments:
            self.app.push_screen(PromptArgsScreen(extra), partial(self._arguments_given, extra))
            return
        self._fetch_extra(extra, {})

    def _arguments_given(self, extra: ServerExtra, values: dict[str, str] | None) -> None:
        if values is not None:
            self._fetch_extra(extra, values)

    @work(thread=True, group="tool-extras", exit_on_error=False)
    def _fetch_extra(self, extra: ServerExtra, arguments: dict[str, str]) -> None:
        tools = self._tools()
        assert tools is not None
        try:
            text = tools.fetch_extra(extra, arguments)
        except LocalfabError as exc:
            self.app.call_from_thread(self.notify, str(exc), title="Tools", severity="error")
            return
        if extra.kind == "resource":
            text = f"[{extra.name}: {extra.uri}]\n```\n{text}\n```\n"
        self.app.call_from_thread(self._insert, text)

    def _insert(self, text: str) -> None:
        box = self.query_one(PromptBox)
        box.insert(text)
        box.focus()

    # --- servers for this chat ----------------------------------------------------------------

    def action_tools(self) -> None:
        """Pick the MCP servers whose tools this chat offers the model."""
        tools = self._tools()
        if self.backend is None:
            self.notify(
                "No model is loaded: tools are offered to a model. Start a chat with "
                "`localfab chat MODEL`.",
                severity="warning",
            )
            return
        if tools is None:
            self.notify("This model's backend cannot call tools.", severity="warning")
            return
        screen = ToolsScreen(tools.tool_servers(), problem=tools.tools_problem)
        self.app.push_screen(screen, self._servers_picked)

    def _servers_picked(self, names: list[str] | None) -> None:
        if names is not None:
            self._use_servers(names)

    @work(thread=True, group="tool-servers", exclusive=True, exit_on_error=False)
    def _use_servers(self, names: list[str]) -> None:
        tools = self._tools()
        assert tools is not None
        rows = tools.use_servers(names)
        used = [r for r in rows if r.in_use]
        failed = [r for r in rows if r.name in names and not r.in_use]
        if used:
            count = sum(len(r.tools) for r in used)
            text = f"{count} tool(s) from {', '.join(r.name for r in used)} offered to the model."
        else:
            text = "No tools are offered to the model."
        self.app.call_from_thread(self.notify, text, title="Tools")
        for row in failed:
            self.app.call_from_thread(
                self.notify, f"{row.name}: {row.error}", title="Tools", severity="error"
            )

    # --- calls --------------------------------------------------------------------------------

    def new_message_sent(self) -> None:
        """A message of the person's: the rounds count from zero again."""
        self._rounds_this_message = 0

    async def ask_about_calls(self, item: ReplyFinished, view: MessageView | None) -> None:
        """The reply made calls: a card for each, after the reply."""
        tools = self._tools()
        if not item.tool_calls or tools is None or item.finish_reason == "cancelled":
            return  # a reply the person stopped: its calls are not asked about
        self._rounds_this_message += 1
        limit = tools.tool_rounds()
        number = self._rounds_this_message
        cards = [
            ToolCallCard(call, round_text=f"round {number}/{limit}") for call in item.tool_calls
        ]
        log = self.query_one("#chat-log", VerticalScroll)
        await log.mount_all(cards)
        self._tool_round = ToolRound(cards, number)
        for card in cards[MAX_CALLS:]:
            card.query_one("#reason", Input).value = f"at most {MAX_CALLS} calls per reply"
            card.action_decide("deny")
        self._check_always(cards[:MAX_CALLS])

    @work(thread=True, group="tool-approvals", exit_on_error=False)
    def _check_always(self, cards: list[ToolCallCard]) -> None:
        """The calls of tools the person always allows are decided so, off the event loop:
        the server is asked for its tools' definitions as they are now (an approval holds
        for the definition it was given to)."""
        tools = self._tools()
        assert tools is not None
        allowed = [card for card in cards if tools.always_allowed(card.call.name)]
        if allowed:
            self.app.call_from_thread(self._allow_cards, allowed)

    def _allow_cards(self, cards: list[ToolCallCard]) -> None:
        for card in cards:
            if card.choice is None:  # the person may have answered meanwhile
                card.action_decide("always")

    def tools_after_reply(self) -> None:
        """The reply's stream ended: the first undecided card takes the focus."""
        current = self._tool_round
        if current is None:
            return
        waiting = [c for c in current.cards if c.choice is None]
        if waiting:
            waiting[0].focus()
            self.query_one("#chat-log", VerticalScroll).anchor()
        else:
            self._run_round(current)

    @on(ToolCallCard.Decided)
    def _decided(self, event: ToolCallCard.Decided) -> None:
        tools, current = self._tools(), self._tool_round
        if tools is None or current is None or event.card not in current.cards:
            return
        if event.choice == "always":
            tools.allow_always(event.card.call.name)
        waiting = [c for c in current.cards if c.choice is None]
        if waiting:
            waiting[0].focus()
        elif not self.streaming and not current.running:
            self._run_round(current)

    def _run_round(self, current: ToolRound) -> None:
        current.running = True
        self._run_calls(current)

    @work(thread=True, group="tool-calls", exclusive=True, exit_on_error=False)
    def _run_calls(self, current: ToolRound) -> None:
        tools = self._tools()
        assert tools is not None
        for card in current.cards:
            if card.choice == "deny" or current.cancel.is_set():
                result = _denied(card.reason, stopped=current.cancel.is_set())
            else:
                self.app.call_from_thread(card.mark, "running… (Esc stops it)")
                result = tools.run_tool(card.call, current.cancel)
            tools.add_tool_result(card.call, result)
            self.post_message(CallDone(card, result))
        self.post_message(RoundDone(current))

    @on(CallDone)
    async def _show_result(self, event: CallDone) -> None:
        card, result = event.card, event.result
        card.mark({"result": "done", "error": "failed"}.get(result.kind, result.kind))
        log = self.query_one("#chat-log", VerticalScroll)
        await log.mount(ToolResultCard(card.call.name, result), after=card)

    @on(RoundDone)
    async def _after_round(self, event: RoundDone) -> None:
        """Every call of the round has its result: the model answers them."""
        current = event.round
        if self._tool_round is current:
            self._tool_round = None
        tools = self._tools()
        if tools is None:
            return
        if current.cancel.is_set():
            # Esc stopped the calls: the turn ends with their results stored, and the model
            # is not asked for more calls the person did not want.
            self.notify("The turn ends here: send a message to go on.", title="Tools")
            return
        last = current.number >= tools.tool_rounds()
        if last:
            self.notify(
                f"{current.number} rounds of tool calls: the model answers without tools now.",
                title="Tools",
            )
        log = self.query_one("#chat-log", VerticalScroll)
        view = self.new_reply_view()
        await log.mount(view)
        view.start_stream()
        self._reply = view
        self._start_reply(lambda cancel: tools.follow_up(last_round=last, cancel=cancel))

    def new_reply_view(self) -> MessageView:
        raise NotImplementedError

    def stop_tools(self) -> bool:
        """Esc while calls wait or run: the running call is stopped, the rest are not run.
        Returns whether there was a round to stop."""
        current = self._tool_round
        if current is None:
            return False
        current.cancel.set()
        for card in current.cards:
            if card.choice is None:
                card.action_decide("deny")
        self.notify("Tool calls stopped.", title="Tools")
        return True


class ToolCommands(ListedCommands):
    """The command palette's entries for tools: the servers, and the prompts and resources of
    the servers a chat uses (a prompt's text goes in the prompt box; a resource is attached)."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        screen = self.screen
        if not isinstance(screen, ToolActions):
            return []
        out: list[tuple[str, str, Callable[[], object]]] = [
            (
                "Tools: MCP servers for this chat",
                "Pick the MCP servers whose tools the model may call (each call is asked)",
                screen.action_tools,
            )
        ]
        tools = screen.tools_backend()
        for extra in tools.server_extras() if tools is not None else []:
            verb = "Prompt" if extra.kind == "prompt" else "Attach"
            name = visible_controls(f"{verb}: {extra.server}/{extra.name}")
            out.append(
                (name, visible_controls(extra.description), partial(screen.use_extra, extra))
            )
        return out


def _denied(reason: str, *, stopped: bool) -> ToolResultShown:
    if stopped:
        return ToolResultShown("The user stopped the tool calls before this one ran.", "cancelled")
    text = "The user denied this call."
    return ToolResultShown(f"{text} Their reason: {reason}" if reason else text, "denied")
