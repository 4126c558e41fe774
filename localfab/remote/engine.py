"""`RemoteEngine`: a llama-server-like server (llama-server, `localfab serve`) driven token for
token, so that a chat session runs over it as over a model loaded here.

The prompt is built here with the server's own chat template (`/props`) and its tokenizer
(`/tokenize`, cached), and sent as token ids to `/completion`: the window, the shift of whole old
turns and the continuation of a cut reply work exactly as locally, and the server reuses its
cached prefix. A thinking model's reasoning and a reply's tool calls are split out of the text
here, by the same steps the local engine uses. The server's KV cache is its own: the engine
cannot shift it (`can_shift` is False; a moved window is processed again there).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from localfab.engine.types import (
    Done,
    GenerationOptions,
    TokenEvent,
)
from localfab.errors import ContextOverflow, UsageError
from localfab.remote.client import (
    NotLlamaServer,
    Remote,
    RemoteClient,
    RemoteError,
    ServerSideCache,
)

TOKENIZE_CACHE = 4096  # texts whose tokens are kept (a prompt is rendered in many pieces)


@dataclass(frozen=True)
class ServerFacts:
    """What a llama-server-like server says of itself (`/props`, `/v1/models`)."""

    n_ctx: int
    chat_template: str | None
    bos_text: str
    eos_text: str
    model: str  # the model it serves, as it names it
    build: str = ""
    slots: int = 1


def read_facts(client: RemoteClient) -> ServerFacts:
    """The server's context, template and special tokens; a RemoteError where it is not a
    llama-server-like server (it has no `/props` with a context size)."""
    try:
        props = client.get("/props")
    except RemoteError as exc:
        if exc.status in (404, 405) or (exc.status == 0 and "not JSON" in str(exc)):
            raise NotLlamaServer(
                f"{client.remote.label} has no llama-server /props endpoint: it is not a "
                "llama-server or `localfab serve`",
                status=exc.status,
            ) from exc
        raise
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        raise NotLlamaServer(
            f"{client.remote.label}'s /props says no context size: is it a llama-server?"
        )
    model = str(props.get("model_alias") or "") or _model_file(str(props.get("model_path", "")))
    return ServerFacts(
        n_ctx=n_ctx,
        chat_template=props.get("chat_template") or None,
        bos_text=str(props.get("bos_token") or ""),
        eos_text=str(props.get("eos_token") or ""),
        model=model,
        build=str(props.get("build_info") or ""),
        slots=int(props.get("total_slots") or 1),
    )


def _model_file(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


class RemoteEngine(ServerSideCache):
    """A ChatEngine and a Tokenizer over a llama-server-like server (module docstring)."""

    def __init__(self, client: RemoteClient, facts: ServerFacts) -> None:
        self.client = client
        self.facts = facts
        # One cell below the slot's: llama-server ends a reply a cell before the local engine
        # would, and the session moves its window when this many are held.
        self.n_ctx = facts.n_ctx - 1
        self.slot_ctx = facts.n_ctx  # the window as the server states it
        self._tokens: OrderedDict[tuple[str, bool, bool], list[int]] = OrderedDict()
        self._pieces: dict[int, bytes] = {}
        self.bos_token = self._single(facts.bos_text)
        self.eos_token = self._single(facts.eos_text)
        probe = self.tokenize("a", add_special=True, parse_special=False)
        self.add_bos = self.bos_token >= 0 and bool(probe) and probe[0] == self.bos_token

    @classmethod
    def connect(cls, remote: Remote) -> RemoteEngine:
        client = RemoteClient(remote)
        try:
            return cls(client, read_facts(client))
        except BaseException:
            client.close()
            raise

    def close(self) -> None:
        self.client.close()

    # --- the tokenizer -------------------------------------------------------------------------

    def _single(self, text: str) -> int:
        if not text:
            return -1
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        return tokens[0] if len(tokens) == 1 else -1

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        key = (text, add_special, parse_special)
        cached = self._tokens.get(key)
        if cached is not None:
            self._tokens.move_to_end(key)
            return list(cached)
        reply = self.client.post(
            "/tokenize",
            {
                "content": text,
                "add_special": add_special,
                "parse_special": parse_special,
                "with_pieces": True,
            },
        )
        tokens = self._keep_pieces(reply)
        self._tokens[key] = tokens
        if len(self._tokens) > TOKENIZE_CACHE:
            self._tokens.popitem(last=False)
        return list(tokens)

    def learn(self, tokens: Sequence[int]) -> None:
        """Ask the server once for the pieces of the tokens not known here yet."""
        unknown = sorted({t for t in tokens if t >= 0 and t not in self._pieces})
        if not unknown:
            return
        self._keep_pieces(self.client.post("/tokenize", {"content": unknown, "with_pieces": True}))

    def _keep_pieces(self, reply: Any) -> list[int]:
        """The ids of a /tokenize answer, each one's piece kept (a string, or the bytes of
        one that is not whole UTF-8, as llama-server sends them)."""
        tokens: list[int] = []
        for item in reply.get("tokens", []) if isinstance(reply, dict) else []:
            if isinstance(item, dict):
                piece = item.get("piece", "")
                token = int(item["id"])
                self._pieces[token] = (
                    piece.encode("utf-8") if isinstance(piece, str) else bytes(piece)
                )
            else:
                token = int(item)
            tokens.append(token)
        return tokens

    def settle(self, tokens: list[int], text: str) -> list[int]:
        """The token ids of a streamed reply as they spell its text exactly: without a tail the
        text does not hold (the end-of-generation token llama-server sends last; the tokens of a
        character cut in two at the end, whose text was held back: a continuation writes it
        again). Where
        the streamed ids do not spell the text (llama-server leaves out the ids of tokens that
        end inside a character), the text is tokenized instead."""
        self.learn(tokens)
        want = text.encode("utf-8")
        spelled = b"".join(self._pieces.get(t, b"") for t in tokens)
        if spelled.startswith(want):  # exactly, or with a tail the text does not hold
            kept, size = list(tokens), len(spelled)
            while size > len(want):
                size -= len(self._pieces.get(kept.pop(), b""))
            if size == len(want):
                return kept
        return self.tokenize(text, add_special=False, parse_special=False) if text else []

    def token_bytes(self, token: int, *, special: bool = True) -> bytes:
        if token < 0:  # no such token (a server whose model has no BOS or EOS)
            return b""
        piece = self._pieces.get(token)
        if piece is None:
            reply = self.client.post("/detokenize", {"tokens": [token]})
            piece = str(reply.get("content", "")).encode("utf-8")
            self._pieces[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        if token == self.bos_token and self.facts.bos_text:
            return self.facts.bos_text
        if token == self.eos_token and self.facts.eos_text:
            return self.facts.eos_text
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        return self.facts.chat_template

    # --- generation ----------------------------------------------------------------------------

    def stream(
        self, prompt: Sequence[int], options: GenerationOptions | None = None
    ) -> Iterator[TokenEvent | Done]:
        """Generate after `prompt` on the server; the same events as the local engine's."""
        options = options or GenerationOptions()
        if not prompt:
            raise UsageError("the prompt is empty")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflow(len(prompt), self.n_ctx)
        from localfab.remote.reply import RemoteReply

        return RemoteReply(self, list(prompt), options).run()


def connect(remote: Remote) -> Any:
    """The engine for `remote`: token for token where it is a llama-server (or `localfab
    serve`), else through its OpenAI chat API (`chat_api.ChatApiEngine`)."""
    from localfab.remote.chat_api import ChatApiEngine

    try:
        return RemoteEngine.connect(remote)
    except NotLlamaServer:
        return ChatApiEngine.connect(remote)
