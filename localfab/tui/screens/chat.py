"""The chat screen: the conversation, the prompt box, the sessions panel and the status bar.

Slow work runs off the UI thread: loading the model and opening a session (which rebuilds the KV
cache) in thread workers, a reply on the backend's engine thread, whose events go into an inbox
that a frame timer drains (one batch of text per frame; the Markdown widget appends each batch,
re-parsing only its last block). The screen's parts: saved-chat actions
(`chat_sessions.SessionActions`), message versions (`chat_versions.VersionActions`: regenerate,
edit, switch) and the pieces that need no screen (`chat_parts`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Footer, Static

from localfab.tui.backend import (
    ChatBackend,
    ReplyContinued,
    ReplyFinished,
    StoredTurn,
    ToolCallWriting,
    WindowShifted,
)
from localfab.tui.image_paths import command_path
from localfab.tui.pacing import StreamingGC, cpu_share_for, max_interval_for
from localfab.tui.reply_stream import InboxItem, ReplyFailed, ReplyStream, StreamEnd, Thought
from localfab.tui.screens.chat_copy import CopyActions
from localfab.tui.screens.chat_images import ImageActions
from localfab.tui.screens.chat_parts import (
    ReplyJob,
    merge_continued,
    progress_note,
    reply_footer,
    shown_index,
)
from localfab.tui.screens.chat_sessions import SessionActions, SessionOpened
from localfab.tui.screens.chat_thinking import ThinkingActions
from localfab.tui.screens.chat_tools import ToolActions, ToolCommands
from localfab.tui.screens.chat_versions import VersionActions, VersionCommands
from localfab.tui.widgets.chat_log import ChatLog
from localfab.tui.widgets.dialogs import ErrorDialog
from localfab.tui.widgets.load_panel import LoadPanel
from localfab.tui.widgets.messages import MessageView, ShiftDivider
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.sessions import SessionsPanel
from localfab.tui.widgets.status import StatusBar
from localfab.tui.widgets.versions import ChatMessage

if TYPE_CHECKING:
    from localfab.tui.sessions import DeletedSession

WIDE = 100  # from this width the sessions panel shows unless the user hid it


class ChatScreen(
    SessionActions, VersionActions, ThinkingActions, ToolActions, CopyActions, ImageActions
):
    """Chat with the loaded model."""

    AUTO_FOCUS = "#prompt"
    COMMANDS = {VersionCommands, ToolCommands}

    BINDINGS = [
        Binding("escape", "stop", "Stop", id="chat.stop"),
        Binding("ctrl+c", "interrupt", "Stop/quit", id="chat.interrupt", show=False, priority=True),
        Binding("ctrl+r", "continue_reply", "Continue", id="chat.continue"),
        Binding("alt+r", "regenerate", "Regenerate", id="chat.regenerate", show=False),
        Binding("alt+e", "edit_message", "Edit last", id="chat.edit", show=False),
        Binding("alt+up", "focus_messages", "Messages", id="chat.messages", show=False),
        Binding("ctrl+n", "new_chat", "New chat", id="chat.new"),
        Binding("ctrl+s", "toggle_sessions", "Chats", id="chat.sessions"),
        Binding("ctrl+f", "search", "Search", id="chat.search", show=False),
        # Priority: the prompt box, which has the focus, would take Ctrl+Y as redo. Not in the
        # footer, which the prompt box's binding used to hide it from (it is in the palette).
        Binding("ctrl+y", "copy_reply", "Copy reply", id="chat.copy", show=False, priority=True),
        Binding("ctrl+g", "copy_code", "Copy code", id="chat.copy_code", show=False),
        Binding("ctrl+z", "undo_delete", "Undo delete", id="chat.undo", show=False),
        Binding("ctrl+end,end", "follow", "Follow", id="chat.follow", show=False),
        Binding("ctrl+l", "cancel_load", "Cancel load", id="chat.cancel_load", show=False),
        Binding("f3,alt+t", "toggle_thought", "Thought", id="chat.thought", show=False),
        Binding("f5", "tools", "Tools", id="chat.tools", show=False),
    ]

    class InboxWoke(Message):
        """The reply's worker put something in the inbox that is shown at once (its first event,
        an end, a failure, a shift): text alone waits for the pacer's tick."""

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, ChatScreen.InboxWoke)

    def __init__(
        self,
        backend: ChatBackend | None,
        *,
        model_name: str | None,
        session_id: int | None = None,
        system: str | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.model_name = model_name
        self.start_session = session_id
        self.system = system
        self.loaded = False
        self.model_loading = False
        self.streaming = False
        self.last_finish: str | None = None
        self.replies_finished = 0  # replies (and continuations) that ended, for tests and bench
        self._cancel = threading.Event()
        self._reply: MessageView | None = None
        self._tick: Timer | None = None  # the next frame of a streaming reply
        self._panel_user_set = False
        self._deleted: DeletedSession | None = None
        self._interrupt_at = 0.0
        self._search_notice_shown = False
        self.stream = ReplyStream()
        self.pacer = self.stream.pacer
        self._prompt_box: PromptBox | None = None  # found once: the frame tick reads it
        self._blink = True  # the prompt's cursor blink, held steady while a reply streams
        self._gc = StreamingGC()
        self.attached = []  # images waiting to go with the next message (`ImageActions`)

    # --- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield SessionsPanel(id="sessions", now=self.lf_app.clock_now)
            with Vertical(id="chat-column"):
                with ChatLog(id="chat-log"):
                    yield Static(self._welcome(), id="welcome", markup=False)
                yield LoadPanel()
                yield Static("", id="attachments", markup=False)
                yield PromptBox(id="prompt", placeholder="Message (Enter sends, Ctrl+J new line)")
        yield StatusBar(id="status")
        yield Footer()

    def _welcome(self) -> str:
        if self.backend is None:
            return (
                "No model is loaded.\n\n"
                "Start a chat with `localfab chat MODEL` (a registered name, a .gguf path, or "
                "smollm2:135m, the built-in model); `localfab list` shows your models and "
                "`localfab pull` downloads one."
            )
        return f"Chat with {self.model_name}. Enter sends; Esc stops a reply; Ctrl+S lists chats."

    def on_mount(self) -> None:
        self.query_one("#chat-log").anchor()
        self._prompt_box = self.query_one(PromptBox)
        self._prompt_box.focus()
        # The first frame is painted before the saved chats are listed and before the engine
        # (and llama.cpp) is imported.
        self.call_after_refresh(self.refresh_sessions)
        if self.backend is not None:
            self.call_after_refresh(self._begin_load)

    def on_resize(self) -> None:
        if not self._panel_user_set:
            self.query_one(SessionsPanel).display = self.size.width >= WIDE

    # --- loading -------------------------------------------------------------------------------

    def _begin_load(self) -> None:
        assert self.backend is not None
        self.model_loading = True
        # A full collection walks every object the app holds with the GIL held (30-60 ms here):
        # kept short while the model loads, as while a reply streams.
        self._gc.begin()
        self.query_one(StatusBar).show_model(f"{self.model_name} (loading)", None, None)
        self.query_one(LoadPanel).start(
            self.backend,
            self.model_name or "",
            session_id=self.start_session,
            system=self.system,
        )

    @on(LoadPanel.Loaded)
    async def _model_loaded(self, event: LoadPanel.Loaded) -> None:
        self.query_one(LoadPanel).display = False
        info = event.info
        self.pacer.cpu_share = share = cpu_share_for(info.threads, os.cpu_count())
        self.pacer.max_interval = max_interval_for(share)
        self.query_one(StatusBar).show_model(
            info.name, info.gpu_layers, info.total_layers, info.remote
        )
        await self._show_turns(event.turns, window_start=event.window_start)
        self.query_one(PromptBox).focus()
        for notice in info.notices:
            self.notify(notice, title="Note", timeout=6)
        self.refresh_sessions()
        self.model_loading = False
        self.loaded = True
        self.call_after_refresh(self._load_gc_end)
        self._show_context()

    @on(LoadPanel.Failed)
    def _model_load_failed(self, event: LoadPanel.Failed) -> None:
        self.model_loading = False
        self._load_gc_end()
        self.query_one(LoadPanel).display = False
        self.query_one(StatusBar).show_model(f"{self.model_name} (not loaded)", None, None)
        if event.cancelled:
            self.notify("Model load cancelled.", title="Load")
            return
        self.app.push_screen(ErrorDialog(f"Could not load {self.model_name}", event.reason))

    def _load_gc_end(self) -> None:
        if not self.streaming:  # a reply already begun keeps it until it ends
            self._gc.end()

    def action_cancel_load(self) -> None:
        if self.model_loading:
            self.query_one(LoadPanel).cancel_load()

    # --- sending and streaming -------------------------------------------------------------------

    @on(PromptBox.Submitted)
    async def _submitted(self, event: PromptBox.Submitted) -> None:
        if not self.loaded:
            why = "the model is still loading" if self.model_loading else "no model is loaded"
            self.notify(f"Cannot send: {why}.", severity="warning")
            return
        if (path := command_path(event.text)) is not None:  # /image PATH attaches
            event.prompt.load_text("")
            self.attach(path)
            return
        if self.streaming:
            self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return
        event.prompt.remember(event.text)
        if self._editing is not None:
            await self._send_edit(event.text)
            return
        event.prompt.load_text("")
        self.new_message_sent()
        log = self.query_one("#chat-log", VerticalScroll)
        await self._drop_welcome()
        images, chips = self.take_images()
        self._user_view = ChatMessage("user", event.text, images=chips)
        self._reply = ChatMessage("assistant", status="generating")
        await log.mount_all([self._user_view, self._reply])
        self._reply.start_stream()
        backend, text = self.backend, event.text
        assert backend is not None
        self._start_reply(lambda cancel: backend.send(text, cancel=cancel, images=images))

    def _start_reply(self, job: ReplyJob) -> None:
        self.streaming = True
        self._cancel = threading.Event()
        self.stream.begin()
        self.query_one("#chat-log", VerticalScroll).anchor()
        self.query_one(StatusBar).show_speed(None, None)
        self._gc.begin()
        if self._prompt_box is not None:
            # A steady cursor while the reply streams: each blink is a repaint, and on shared
            # cores every bit of the UI's CPU comes out of decoding.
            self._blink, self._prompt_box.cursor_blink = self._prompt_box.cursor_blink, False
        # The reply runs on the backend's engine thread, which hands its events to the inbox;
        # only what is shown at once wakes the UI thread, text waits for the pacer's tick.
        stream, wake, cancel = self.stream, self.InboxWoke, self._cancel
        assert self.backend is not None
        self.backend.run_reply(
            lambda: stream.pump(lambda: job(cancel), lambda: self.post_message(wake()))
        )

    @on(InboxWoke)
    async def _woke(self) -> None:
        await self._drain()

    def _schedule_tick(self) -> None:
        """While a reply streams, sleep until the pacer lets waiting text be drawn (at least a
        frame when none waits: the worker wakes the screen for anything else)."""
        if self._tick is not None:
            self._tick.stop()
            self._tick = None
        if not self.streaming:
            return
        self._tick = self.set_timer(self.stream.wait(), self._ticked)

    def _ticked(self) -> None:
        # Drained in the screen's own message loop, never beside a drain the worker asked for.
        self._tick = None
        self.post_message(self.InboxWoke())

    async def _drain(self) -> None:
        """Move what the worker produced onto the screen: one batch of text per frame.

        Text waits while the pacer says so; anything else (an end, a failure, a shift) is
        handled at once, with the text before it. Then the next tick is set.
        """
        try:
            await self._drain_inbox()
        finally:
            self._schedule_tick()

    async def _drain_inbox(self) -> None:
        box = self._prompt_box
        items = self.stream.take(box.last_key_at if box is not None else None)
        if items is None:
            return
        view = self._reply
        for item in items:
            if not isinstance(item, str):
                await self._handle(item)
            elif view is not None:
                await view.write(item)
        self.pacer.drawn()
        # Live figures until the reply's end has shown the final ones (the end wakes the screen
        # at once, so the worker's last word may still be on its way).
        figures = self.stream.live_figures() if self.streaming else None
        if figures is not None:
            self.query_one(StatusBar).show_speed(*figures)

    async def _handle(self, item: InboxItem | Thought) -> None:
        view = self._reply
        log = self.query_one("#chat-log", VerticalScroll)
        if isinstance(item, Thought):
            await self.show_thought(item)
        elif isinstance(item, WindowShifted):
            divider = ShiftDivider(item.turns, item.tokens)
            if view is not None and view.parent is log:
                await log.mount(divider, before=view)
            else:
                await log.mount(divider)
        elif isinstance(item, ReplyContinued | ToolCallWriting):
            if view is not None:
                view.set_footer(progress_note(item))
        elif isinstance(item, ReplyFinished):
            await self._finished(item, view)
        elif isinstance(item, ReplyFailed):
            self.last_finish = "failed"
            if view is not None:
                await view.end_stream()
                view.set_footer(f"✗ {item.reason}", kind="failed")
            self.notify(item.reason, title="Reply failed", severity="error", timeout=8)
        elif isinstance(item, StreamEnd):
            self.label_new_messages()
            self.replies_finished += 1
            self.streaming = False
            if self._prompt_box is not None:
                self._prompt_box.cursor_blink = self._blink
            self._show_context()
            self.refresh_sessions()
            self.call_after_refresh(self._gc.end)  # after the reply's last frame is painted
            self.tools_after_reply()

    async def _finished(self, item: ReplyFinished, view: MessageView | None) -> None:
        self.stream.ended = True
        self.last_finish = item.finish_reason
        if view is not None:
            await view.end_stream()
            view.status = item.finish_reason
            text, kind = reply_footer(item)
            view.set_footer(text, kind=kind)
        self.query_one(StatusBar).show_reply(
            item.ttft_ms, item.tokens_per_second, item.draft_acceptance, item.joules_per_token
        )
        self.thought_finished(item, view)
        for note in item.notes:  # the prompt cache's (a state file discarded, a full disk)
            self.notify(note, title="Note", timeout=8)
        await self.ask_about_calls(item, view)

    def new_reply_view(self) -> MessageView:  # a reply to tool results
        return ChatMessage("assistant", status="generating")

    def _show_context(self) -> None:
        if self.backend is not None and self.loaded:
            used, total = self.backend.context_usage()
            self.query_one(StatusBar).show_context(used, total)

    # --- actions -------------------------------------------------------------------------------

    def action_stop(self) -> None:
        """Stop the reply now, keeping what it wrote (else stop editing, or leave a message)."""
        if self.streaming:
            self._cancel.set()
            if self._reply is not None:
                self._reply.set_footer("stopping…")
        elif self.stop_tools():
            return
        elif self.model_loading:
            self.action_cancel_load()
        elif self._cancel_edit(clear=True) or isinstance(self.focused, ChatMessage):
            self.query_one(PromptBox).focus()

    def action_interrupt(self) -> None:
        """Ctrl+C stops a reply; with no reply, a second Ctrl+C quits."""
        if self.streaming:
            self.action_stop()
            return
        now = time.monotonic()
        if now - self._interrupt_at < 2.0:
            self.app.exit()
            return
        self._interrupt_at = now
        self.notify("Press Ctrl+C again (or Ctrl+Q) to quit.", timeout=2)

    async def action_continue_reply(self) -> None:
        """Continue the last reply where it was cut or stopped."""
        if self.streaming or not self.loaded:
            return
        if self.last_finish not in ("length", "cancelled") or self._reply is None:
            self.notify("There is no cut or stopped reply to continue.", severity="warning")
            return
        self._reply.set_footer("continuing…")
        self._reply.start_stream()
        backend = self.backend
        assert backend is not None
        self._user_view = None
        self._start_reply(lambda cancel: backend.continue_reply(cancel=cancel))

    def action_follow(self) -> None:
        """Scroll to the end and follow the reply again."""
        self.query_one("#chat-log", VerticalScroll).anchor()

    # --- sessions ------------------------------------------------------------------------------

    @on(SessionOpened)
    async def _session_opened(self, event: SessionOpened) -> None:
        await self._show_turns(
            event.turns, highlight=event.highlight, window_start=event.window_start
        )
        self._show_context()
        self.refresh_sessions()
        self.query_one(PromptBox).focus()

    async def _show_turns(
        self,
        turns: list[StoredTurn],
        *,
        highlight: int | None = None,
        window_start: int | None = None,
    ) -> None:
        log = self.query_one(ChatLog)
        self._reply = None
        self._user_view = None
        self._cancel_edit(clear=True)
        self.last_finish = None
        prompt = self.query_one(PromptBox)
        prompt.earlier.clear()
        shown = merge_continued(turns)
        resume_at, left = None, 0
        if window_start and window_start < len(turns):
            resume_at = shown_index(turns, window_start)
            left = sum(1 for t in turns[:window_start] if t.role == "user")
        placed = await log.show(shown, welcome=self._welcome(), resume_at=resume_at, left=left)
        views = [v for v in placed if v is not None]
        for turn in shown:
            if turn.role == "user":
                prompt.remember(turn.content)
        if views and views[-1].role == "assistant":
            self._reply = views[-1]
            last = shown[-1].status
            self.last_finish = {"length": "length", "interrupted": "cancelled"}.get(last)
            if last == "length":
                views[-1].set_footer("✂ cut at the token limit · ctrl+r continues", kind="cut")
            elif last == "interrupted":
                views[-1].set_footer("■ interrupted · ctrl+r continues", kind="stopped")
        hit = placed[shown_index(turns, highlight)] if highlight is not None else None
        if hit is None:
            log.anchor()
            return
        hit.add_class("search-hit")
        log.anchor(False)  # stay on the hit; sending a message follows the end again
        self.call_after_refresh(log.reveal, hit)

    async def _drop_welcome(self) -> None:
        await self.query_one(ChatLog).drop_welcome()

    # --- quitting ------------------------------------------------------------------------------

    def on_unmount(self) -> None:
        # A reply cut short by quitting (or by closing this screen) never reaches its end.
        self._gc.end()

    async def stop_for_exit(self) -> None:
        """Stop a streaming reply and wait until it is saved (marked interrupted)."""
        for panel in self.query(LoadPanel):
            panel.cancel.set()
        if self.streaming:
            self._cancel.set()
            # The generator marks the reply interrupted, then ends.
            await asyncio.to_thread(self.stream.finished.wait)
