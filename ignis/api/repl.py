"""`ignis chat`: the interactive loop. Line editing and a history kept across sessions (readline,
where Python has it), multi-line input, slash commands, and a Ctrl-C that stops a reply, not the chat.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, TextIO

from ..errors import IgnisError

PROMPT = ">>> "
MORE = "... "                 # the prompt inside a """ block and after a trailing backslash
FENCE = '"""'                 # opens and closes a block of lines sent as one message (Ollama's)
HISTORY_FILE = "chat_history"  # under IGNIS_HOME: one JSON string per line, so that a
HISTORY_LENGTH = 1000          # multi-line message stays one entry
EXIT_WORDS = frozenset({"/exit", "/quit", "/bye", "exit", "quit"})
ROLES = ("system", "user", "assistant")

HELP = '''\
commands:
  /help           this text
  /system TEXT    set the system message (the turns so far stay); /system alone shows it
  /save FILE      write the conversation, system message included, as a JSON list of
                  OpenAI-style {"role": ..., "content": ...} messages; it replaces a FILE
                  that holds a conversation, never a file of another kind
  /save! FILE     the same, replacing FILE whatever it holds
  /load FILE      replace the conversation (system message included) with one /save wrote
  /reset, /clear  forget the turns (the system message stays)
  /stats          the last reply's timings
  /exit, /quit, /bye, exit, quit
                  leave (so do Ctrl-D and Ctrl-C on an empty line)
input:
  Enter sends the line; a paste of several lines is one message.
  A line ending in \\ continues on the next line.
  A line starting with """ opens a block that a line ending in """ closes: one message,
  never a command (the way to send text that starts with /).
  Arrow keys edit the line and recall earlier messages (kept in IGNIS_HOME/chat_history).
Ctrl-C stops a reply: the part already shown stays in the conversation as the answer, as in
llama.cpp (/reset or /load to drop it). At the prompt Ctrl-C clears the line; on an empty line
it quits.'''


class ConversationFileError(IgnisError, ValueError):
    """A /load file is missing, not JSON, or not a list of chat messages."""


class LineInterrupted(KeyboardInterrupt):
    """Ctrl-C while reading a line; `pending`: the line being edited held text."""

    def __init__(self, pending: bool):
        super().__init__()
        self.pending = pending


class Input(NamedTuple):
    text: str
    literal: bool        # from a """ block: a message even if it starts with /


# --- reading -----------------------------------------------------------------------------------

@contextmanager
def _on_sigint(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """`handler` answers SIGINT while the block runs (only the main thread may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _import_readline():
    try:
        import readline
    except ImportError:          # Windows, or a Python built without it: plain input()
        return None
    return readline


class LineEditor:
    """input() with readline when Python has it and stdin and stdout are the terminal: line
    editing, bracketed paste (a paste of several lines comes back as one string) and a history file
    of whole messages. Otherwise plain input() with no history; prompts go to `screen` (None: no
    prompts), where the cursor is also put back on a fresh line after Ctrl-C and Ctrl-D."""

    def __init__(self, terminal: bool, history: Path | None, screen: TextIO | None = None):
        # input() itself uses readline only when both are terminals; with stdout redirected it
        # would write the prompts into the file
        self.screen = screen
        self.readline = _import_readline() if terminal else None
        self.history = history if self.readline is not None else None
        self._last: str | None = None
        # GNU readline 8.1+ ends the line itself at Ctrl-D while bracketed paste is on
        self._eof_ends_line = False
        rl = self.readline
        if rl is None:
            return
        rl.set_auto_history(False)           # we add whole messages, not their lines
        libedit = "libedit" in (rl.__doc__ or "") or getattr(rl, "backend", "") == "editline"
        term = os.environ.get("TERM", "")
        version = getattr(rl, "_READLINE_RUNTIME_VERSION", 0)
        if not libedit and version >= 0x0700:
            # CPython turns bracketed paste off at import (bpo-42819: its own REPL ran each pasted
            # line); a chat wants it on. libedit and readline before 7.0 have no such mode: there a
            # paste is line by line, and """ blocks are the way to send several lines.
            rl.parse_and_bind("set enable-bracketed-paste on")
            self._eof_ends_line = version >= 0x0801 and term not in ("", "dumb")  # readline's test
        if self.history is not None:
            self._load_history()

    def read_line(self, prompt: str) -> str:
        """One input() (several lines for a paste); EOFError at the end, LineInterrupted for Ctrl-C.
        Either way a terminal's cursor is left at the start of a fresh line."""
        def interrupted(signum: int, frame: Any) -> None:
            # runs inside input(), before readline clears its buffer
            pending = bool(self.readline.get_line_buffer()) if self.readline is not None else False
            raise LineInterrupted(pending)

        try:
            with _on_sigint(interrupted):
                if self.readline is not None or not prompt or self.screen is None:
                    return input(prompt)
                self.screen.write(prompt)
                self.screen.flush()
                return input()
        except LineInterrupted:
            self._new_line()
            raise
        except EOFError:
            if not self._eof_ends_line:
                self._new_line()
            raise

    def _new_line(self) -> None:
        if self.screen is not None:
            self.screen.write("\n")
            self.screen.flush()

    def remember(self, entry: str) -> None:
        """Add a message or command to the history (and to the history file)."""
        if self.readline is None or not entry.strip() or entry == self._last:
            return
        self._last = entry
        self.readline.add_history(entry)
        if self.history is None:
            return
        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            # private, as a shell's history: chats can hold anything
            fd = os.open(self.history, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            with open(fd, "rb+", buffering=0) as f:
                data = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
                size = f.seek(0, os.SEEK_END)
                if size:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":     # after a line cut short (a crash): not glued to it
                        data = b"\n" + data
                while data:                  # one write, as a rule: sessions' lines do not mix
                    data = data[f.write(data):]
        except OSError:
            self.history = None          # a read-only home: the chat goes on without the file

    def _load_history(self) -> None:
        assert self.history is not None and self.readline is not None
        try:
            data = self.history.read_bytes()
        except OSError:
            return
        lines = data.splitlines()
        entries = _history_entries(lines[-HISTORY_LENGTH:])
        for entry in entries:
            self.readline.add_history(entry)
        self._last = entries[-1] if entries else None
        if len(lines) > 2 * HISTORY_LENGTH:      # appends only grow it: trim now and then
            self._trim_history(data, entries)

    def _trim_history(self, data: bytes, entries: list[str]) -> None:
        """Rewrite the history file as `entries` (read from `data`) by replacing it, so that other
        sessions reading or appending to it never meet a half-written file; what they appended
        since `data` was read is kept."""
        assert self.history is not None
        try:
            now = self.history.read_bytes()
            if not now.startswith(data):         # another session trimmed it meanwhile
                return
            entries = (entries + _history_entries(now[len(data):].splitlines()))[-HISTORY_LENGTH:]
            replace_file(self.history, "".join(json.dumps(e, ensure_ascii=False) + "\n"
                                               for e in entries), private=True)
        except OSError:
            pass


def _history_entries(lines: list[bytes]) -> list[str]:
    """The messages of history file lines; a damaged line (not UTF-8, not a JSON string: a crash
    mid-write, an edit by hand) is skipped."""
    entries = []
    for line in lines:
        try:
            entry = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(entry, str) and entry.strip():
            entries.append(entry)
    return entries


class TurnReader:
    """Joins input into messages. A line is a message, except:
    - a line ending in a backslash continues on the next line;
    - a line starting with \"\"\" opens a block that the next line ending in \"\"\" closes (text
      beside the fences belongs to the message, as in Ollama);
    - a string of several lines from read_line (a bracketed paste, a recalled message) is one
      message as it is.
    At the end of input an open block or continuation is sent as it stands."""

    def __init__(self, read_line: Callable[[str], str], prompts: bool = True):
        self._read_line = read_line
        self._prompt, self._more = (PROMPT, MORE) if prompts else ("", "")
        self._eof = False

    def read(self) -> Input:
        """The next message. Raises EOFError at the end of input and KeyboardInterrupt for Ctrl-C
        on an empty line; Ctrl-C with text pending drops that text and returns an empty Input."""
        if self._eof:
            raise EOFError
        parts: list[str] = []
        mode = ""                 # "", "block" (inside """) or "more" (after a backslash)
        while True:
            try:
                raw = self._read_line(self._more if mode else self._prompt)
            except KeyboardInterrupt as e:
                if mode or getattr(e, "pending", False):
                    return Input("", False)
                raise
            except EOFError:
                if not mode:
                    raise
                self._eof = True
                return Input("\n".join(parts), mode == "block")
            text = raw.replace("\r\n", "\n").replace("\r", "\n")
            if "\n" in text.rstrip("\n"):
                lines = text.rstrip("\n").split("\n")
                if mode == "more" or (not mode and not lines[0].lstrip().startswith(FENCE)):
                    return Input("\n".join(parts + lines), False)      # a paste: as it is
            else:
                lines = [text.rstrip("\n")]
            for i, line in enumerate(lines):
                mode, done = self._feed(parts, mode, line)
                if done:
                    return Input("\n".join(parts + lines[i + 1:]), mode == "block")

    @staticmethod
    def _feed(parts: list[str], mode: str, line: str) -> tuple[str, bool]:
        """Add one line to the message; returns the new mode and whether the message is complete
        (the mode returned with a complete message says whether it was a block)."""
        if mode == "block":
            end = line.rstrip()
            if end.endswith(FENCE):
                if end[:-len(FENCE)]:
                    parts.append(end[:-len(FENCE)])
                return "block", True
            parts.append(line)
            return "block", False
        if not mode and line.lstrip().startswith(FENCE):
            rest = line.lstrip()[len(FENCE):]
            if rest.rstrip().endswith(FENCE):                 # """one line"""
                parts.append(rest.rstrip()[:-len(FENCE)])
                return "block", True
            if rest:
                parts.append(rest)
            return "block", False
        if line.endswith("\\"):
            parts.append(line[:-1])
            return "more", False
        parts.append(line)
        return "", True


class _ReplyInterrupt:
    """The SIGINT handler while a reply is computed. The first Ctrl-C sets `stop`: the generation
    ends before its next step. A forward pass checks nothing, though, and the prompt's can take
    long (a /load of a long conversation, a new /system): there a second Ctrl-C raises
    KeyboardInterrupt out of it. Only there, and once: KVSession.prefill resets the session on any
    exception, so the KV slot and the ids it holds stay consistent (the next turn computes its
    whole prompt again), while an exception elsewhere could land in the bookkeeping."""

    def __init__(self, err: TextIO):
        self.stop = threading.Event()
        self._err = err
        self._raised = False

    def __call__(self, signum: int, frame: Any) -> None:
        in_prefill = _in_prefill(frame)
        if not self.stop.is_set():
            self.stop.set()
            if in_prefill:          # nothing shows for a while yet: say that it was heard
                self._err.write("\n(stopping once the prompt is read; Ctrl-C again stops now)\n")
                self._err.flush()
        elif in_prefill and not self._raised:
            self._raised = True
            raise KeyboardInterrupt


def _in_prefill(frame: Any) -> bool:
    """Whether the interrupted code runs inside KVSession.prefill (the prompt's forward pass)."""
    from ..generate.loop import KVSession
    code = KVSession.prefill.__code__
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


# --- the conversation file ---------------------------------------------------------------------

def replace_file(path: Path, text: str, *, private: bool = False) -> None:
    """Write `text` (UTF-8) to `path` whole: into a new file beside it, then os.replace. A reader
    (another session) sees the old file or the new one, never part of one, and a write that fails
    or is interrupted leaves the old file as it was. A file that exists keeps its permissions;
    a new one gets the umask's (0600 if `private`). A symbolic link's target is replaced."""
    path = Path(os.path.realpath(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
    try:
        with open(fd, "w", encoding="utf-8") as f:
            if mode is not None:
                os.chmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())          # the new content is on disk before it replaces the old
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_conversation(path: Path, messages: list[dict[str, str]]) -> None:
    replace_file(path, json.dumps(messages, ensure_ascii=False, indent=2) + "\n")


def load_conversation(path: Path) -> list[dict[str, str]]:
    """The messages of a file /save wrote (or any JSON list of {role, content} messages with
    roles system, user and assistant, a system message first if at all). Raises
    ConversationFileError with a one-line reason."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConversationFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConversationFileError(f"{path} is a directory, not a conversation file") from None
    except UnicodeDecodeError:
        raise ConversationFileError(f"{path} is not UTF-8 text") from None
    except OSError as e:
        raise ConversationFileError(f"cannot read {path}: {(e.strerror or str(e)).lower()}") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConversationFileError(f"{path} is not JSON ({e})") from None
    want = 'a JSON list of {"role": ..., "content": ...} messages, as /save writes'
    if not isinstance(data, list):
        raise ConversationFileError(f"{path} holds a JSON {type(data).__name__}; expected {want}")
    messages = []
    for i, m in enumerate(data):
        where = f"{path}: message {i + 1}"
        if not isinstance(m, dict):
            raise ConversationFileError(f"{where} is a {type(m).__name__}, not an object; expected {want}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ConversationFileError(f"{where} has role {role!r}; roles are {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ConversationFileError(f"{where} has no text content (\"content\" must be a string)")
        if role == "system" and i > 0:
            raise ConversationFileError(f"{where} is a system message; only the first may be one")
        messages.append({"role": role, "content": content})
    return messages


# --- the chat ----------------------------------------------------------------------------------

class Chat:
    """The conversation, its replies and the slash commands."""

    def __init__(self, model: Any, sampling: dict[str, Any], *, system: str | None = None,
                 verbose: bool = False, print_timings: Callable[[Any], None] | None = None,
                 out: TextIO | None = None, err: TextIO | None = None):
        self.model = model
        self.sampling = sampling
        self.system = system
        self.turns: list[dict[str, str]] = []
        self.verbose = verbose
        self.print_timings = print_timings
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.last = None             # the last complete reply's GenerationResult
        self._commands: dict[str, Callable[[str], None]] = {
            "/help": self._help, "/system": self._system, "/save": self._save,
            "/save!": lambda arg: self._save(arg, force=True), "/load": self._load,
            "/reset": self._reset, "/clear": self._reset, "/stats": self._stats}

    @property
    def messages(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return system + self.turns

    def handle(self, turn: Input) -> bool:
        """Act on one input; False when it asks to leave."""
        word = turn.text.strip()
        if not word:
            return True
        if not turn.literal:
            if word in EXIT_WORDS:
                return False
            if word.startswith("/"):
                self.command(word)
                return True
        self.send(turn.text)
        return True

    def say(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def command(self, line: str) -> None:
        name, *arg = line.split(None, 1)       # the argument may span lines (a paste)
        run = self._commands.get(name)
        if run is None:
            self.say(f"unknown command {name!r}; /help lists the commands")
        else:
            run(arg[0].strip() if arg else "")

    def send(self, text: str) -> None:
        """Stream the model's reply to `text`. Ctrl-C stops it at the next token and keeps the
        part shown; a turn the context cannot hold is reported and dropped."""
        from ..generate import ContextLengthExceeded, GenerationCancelled, InvalidParameterError
        from ..generate.loop import cancel_when
        turn = {"role": "user", "content": text}
        interrupt = _ReplyInterrupt(self.err)
        stop = interrupt.stop
        shown: list[str] = []
        result = None
        # Ctrl-C sets `stop`, which ends the generation before its next step (cancel_when) and
        # this loop before it shows another piece: the interrupt never lands in the middle of the
        # bookkeeping, so the model and the history stay consistent. Only a second Ctrl-C during
        # the prompt's forward pass raises (_ReplyInterrupt).
        with _on_sigint(interrupt):
            try:
                ids = self.model.chat_prompt_ids(self.messages + [turn])
                kwargs = self.sampling
                room = self.model.n_ctx - len(ids)
                if kwargs.get("max_tokens") is not None and room > 0:   # a cap, as `ignis run`'s
                    kwargs = {**kwargs, "max_tokens": min(kwargs["max_tokens"], room)}
                run = self.model.start(ids, **kwargs)
                with cancel_when(stop):
                    try:
                        for chunk in run:
                            if stop.is_set():        # pressed while this piece was computed
                                break
                            if chunk.text:
                                self.out.write(chunk.text)
                                self.out.flush()
                                shown.append(chunk.text)
                    finally:
                        run.close()
                result = run.result
            except (ContextLengthExceeded, InvalidParameterError) as e:
                # the conversation goes on: this turn is dropped, the history kept
                from .cli import _cli_error_text  # the flags the user typed, not Python names
                self.say(f"ignis chat: {_cli_error_text(e)}\n(/reset starts a new conversation)")
                return
            except (GenerationCancelled, KeyboardInterrupt):
                stop.set()
        self.out.write("\n\n")
        self.out.flush()
        if result is None:                     # stopped: keep what the user saw
            partial = "".join(shown)
            if partial:
                self.turns += [turn, {"role": "assistant", "content": partial}]
            else:
                self.say("(stopped before the reply began; the message was dropped)")
            return
        self.turns += [turn, {"role": "assistant", "content": result.text}]
        self.last = result
        if self.verbose and self.print_timings is not None:
            self.print_timings(result)

    # --- commands --------------------------------------------------------------------------
    def _help(self, arg: str) -> None:
        self.say(HELP)

    def _system(self, arg: str) -> None:
        if not arg:
            self.say(f"system message: {self.system}" if self.system is not None
                     else "(no system message; /system TEXT sets one)")
            return
        self.system = arg
        self.say("(system message set)")

    def _save(self, arg: str, force: bool = False) -> None:
        if not arg:
            self.say("usage: /save FILE (/save! FILE replaces a file that is not a conversation)")
            return
        path = Path(arg).expanduser()
        if path.is_dir():
            self.say(f"ignis chat: error: {path} is a directory; /save takes a file name")
            return
        if not force and os.path.exists(path):
            try:
                load_conversation(path)      # a conversation (an earlier /save) may be replaced
            except ConversationFileError as e:
                self.say(f"ignis chat: error: not saved: {e}; /save! {arg} replaces it anyway")
                return
        try:
            save_conversation(path, self.messages)
        except OSError as e:
            self.say(f"ignis chat: error: cannot write {path}: {(e.strerror or str(e)).lower()}")
            return
        self.say(f"(saved {len(self.messages)} messages to {path})")

    def _load(self, arg: str) -> None:
        if not arg:
            self.say("usage: /load FILE")
            return
        path = Path(arg).expanduser()
        try:
            messages = load_conversation(path)
        except ConversationFileError as e:
            self.say(f"ignis chat: error: {e}")
            return
        has_system = bool(messages) and messages[0]["role"] == "system"
        # one statement: a Ctrl-C cannot leave the new system message with the old turns
        self.system, self.turns = ((messages[0]["content"], messages[1:]) if has_system
                                   else (None, messages))
        self.last = None
        self.say(f"(loaded {len(messages)} messages from {path})")

    def _reset(self, arg: str) -> None:
        self.turns = []
        self.model.reset()
        self.say("(conversation cleared)")

    def _stats(self, arg: str) -> None:
        if self.last is None:
            self.say("(no reply yet)")
        elif self.print_timings is not None:
            self.print_timings(self.last)


def run_chat(model: Any, sampling: dict[str, Any], *, system: str | None = None,
             verbose: bool = False, print_timings: Callable[[Any], None] | None = None) -> int:
    """The REPL on stdin/stdout. Prompts only when stdin is a terminal; editing and history only
    when stdout is one too. With stdout redirected (`ignis chat M > log.txt`) the prompts go to
    stderr, as Python's and the shells' do, so the file gets the replies alone.
    Returns the exit status: 0 on /exit, Ctrl-D, the end of input or Ctrl-C on an empty line."""
    from ..paths import ignis_home
    interactive = sys.stdin.isatty()
    terminal = interactive and sys.stdout.isatty()
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        # a non-UTF-8 terminal gets '?' for an emoji instead of losing the chat to an exception
        sys.stdout.reconfigure(errors="replace")
    editor = LineEditor(terminal, ignis_home() / HISTORY_FILE,
                        screen=sys.stdout if terminal else sys.stderr if interactive else None)
    reader = TurnReader(editor.read_line, prompts=interactive)
    chat = Chat(model, sampling, system=system, verbose=verbose, print_timings=print_timings)
    while True:
        try:
            turn = reader.read()
        except (EOFError, KeyboardInterrupt):
            return 0
        try:
            if turn.text.strip() not in EXIT_WORDS or turn.literal:
                # a block is recalled as a block, so it stays a message
                editor.remember(f"{FENCE}\n{turn.text}\n{FENCE}" if turn.literal else turn.text)
            if not chat.handle(turn):
                return 0
        except KeyboardInterrupt:
            # Ctrl-C outside the prompt and the reply (a slow /save, a slow disk for the
            # history): back to the prompt
            chat.say("")
