"""`ignis chat` as a person uses it: through a pseudo-terminal (stdlib pty), keys in, screen out,
the conversation checked through /save. Plus the input reader, the commands and /load's checks
without a terminal.

The pty tests run `ignis chat` on the tiny model with --max-tokens 8 at temperature 0 (a reply takes
milliseconds). Waits are generous timeouts on what the terminal shows, never timing thresholds.
"""
from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

import ignis
from ignis.api.cli import main
from ignis.api.repl import (HELP, Chat, ConversationFileError, Input, TurnReader,
                             load_conversation)

try:
    import pty
    import readline
except ImportError:             # Windows: the reader and command tests still run
    pty = readline = None
GNU_READLINE = "GNU readline" in (getattr(readline, "__doc__", None) or "")
terminal = pytest.mark.skipif(pty is None or readline is None, reason="needs pty and readline")

TIMEOUT = 60.0             # seconds to wait for one expected output; only a hang reaches it
MAX_TOKENS = 8
FLAGS = ["--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--ctx", "256", "--threads", "1", "-q"]
PROMPT = b">>> "
MORE = b"... "
UP, LEFT = b"\x1b[A", b"\x1b[D"
CTRL_C, CTRL_D = b"\x03", b"\x04"
PASTE_START, PASTE_END = b"\x1b[200~", b"\x1b[201~"

# The child is `ignis chat` with two test hooks, so that the test presses Ctrl-C at a moment the
# reply is certainly under way: while the file $IGNIS_TEST_HOLD exists, the third decode step of a
# reply waits (after touching $IGNIS_TEST_WAITING) until the file is removed; while
# $IGNIS_TEST_HOLD_PREFILL exists, so does the forward pass of a prompt (a long prefill).
CHILD = """
import os, sys, time
from pathlib import Path
from ignis.generate import loop
from ignis.runtime import engine
hold, waiting = Path(os.environ["IGNIS_TEST_HOLD"]), Path(os.environ["IGNIS_TEST_WAITING"])
hold_prefill = Path(os.environ["IGNIS_TEST_HOLD_PREFILL"])
step, calls = loop.KVSession.step, [0]
def gated_step(self, token_id):
    if hold.exists():
        calls[0] += 1
        if calls[0] == 3:
            waiting.touch()
            while hold.exists():
                time.sleep(0.01)
    return step(self, token_id)
loop.KVSession.step = gated_step
forward = engine.Engine.forward
def gated_forward(self, tokens, **kwargs):
    if len(tokens) > 1 and hold_prefill.exists():
        waiting.touch()
        while hold_prefill.exists():
            time.sleep(0.01)
    return forward(self, tokens, **kwargs)
engine.Engine.forward = gated_forward
from ignis.api.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Terminal:
    """`ignis chat` on a pseudo-terminal: send() keys, expect() what the screen shows."""

    def __init__(self, tmp: Path, model_dir: Path, home: Path, *flags: str,
                 stdout: Path | None = None):
        script = tmp / "child.py"
        script.write_text(CHILD)
        self.hold, self.waiting = tmp / "hold", tmp / "waiting"
        self.hold_prefill = tmp / "hold_prefill"
        env = {**os.environ, "TERM": "xterm", "INPUTRC": os.devnull, "IGNIS_HOME": str(home),
               "IGNIS_TEST_HOLD": str(self.hold), "IGNIS_TEST_WAITING": str(self.waiting),
               "IGNIS_TEST_HOLD_PREFILL": str(self.hold_prefill)}
        argv = [sys.executable, str(script), "chat", str(model_dir), *FLAGS, *flags]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                       # the child: the pty is its controlling terminal
            try:
                os.chdir(tmp)
                if stdout is not None:          # `ignis chat ... > stdout`
                    os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
                os.execve(sys.executable, argv, env)
            finally:
                os._exit(127)
        self.out = bytearray()
        self.mark = 0                           # expect() looks past the previous match
        self.status: int | None = None

    def send(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def _read(self, timeout: float) -> bool:
        """Read what is there within `timeout`; False once the child has closed the terminal."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:                         # EIO: no process holds the terminal any more
            data = b""
        self.out += data
        return bool(data)

    def expect(self, text: bytes) -> None:
        deadline = time.monotonic() + TIMEOUT
        while (i := self.out.find(text, self.mark)) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{text!r} never appeared; the terminal shows:\n"
                                     f"{bytes(self.out[-3000:])!r}")
        self.mark = i + len(text)

    def line(self, keys: bytes) -> None:
        """Type a line at the prompt and wait for the next prompt."""
        self.expect(PROMPT)
        self.send(keys + b"\r")

    def press(self, key: bytes, then: bytes | None = None) -> None:
        """A key pressed at the prompt once readline waits for one, after the test has seen the
        prompt or the echo of the last key; `then`: what the screen shows next. CPython's
        readline loop runs a signal's handler only when its select() is interrupted: a Ctrl-C
        that lands while readline is still drawing (microseconds after its output, too soon for
        a person) waits for the next signal. So the key goes once the child sleeps: past the
        output seen, the only place readline sleeps is that select() (the output is drained
        meanwhile, so that a write of the child's cannot be what it sleeps in). Where /proc does
        not show that, the key is pressed again while the screen shows nothing new: a Ctrl-C
        still pending is taken with the next one, as one."""
        if os.path.exists(f"/proc/{self.pid}/stat"):
            deadline = time.monotonic() + TIMEOUT
            while not self._asleep():
                assert time.monotonic() < deadline, f"ignis chat never waited for a key: " \
                                                    f"{bytes(self.out[-3000:])!r}"
                self._read(0.001)
            self.send(key)
            if then is not None:
                self.expect(then)
            return
        self.send(key)
        if then is None:
            return
        deadline = time.monotonic() + TIMEOUT
        while (i := self.out.find(then, self.mark)) < 0:
            assert time.monotonic() < deadline, f"{then!r} never appeared: {bytes(self.out)!r}"
            seen = len(self.out)
            self._read(1.0)
            if len(self.out) == seen:
                self.send(key)
        self.mark = i + len(then)

    def _asleep(self) -> bool:
        """Whether the child's main thread sleeps in a select() or poll() (Linux)."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            with open(f"/proc/{self.pid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            return False
        # wchan names the kernel function it waits in, or is "0" where the kernel hides it
        return state == "S" and (wchan in ("", "0") or "poll" in wchan or "select" in wchan)

    def wait_for(self, path: Path) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not path.exists():
            assert time.monotonic() < deadline, f"{path.name} never appeared: {bytes(self.out)!r}"
            self._read(0.01)

    def exit_status(self) -> int:
        deadline = time.monotonic() + TIMEOUT
        while self._read(max(deadline - time.monotonic(), 0)):
            assert time.monotonic() < deadline, f"ignis chat did not exit: {bytes(self.out[-3000:])!r}"
        _, status = os.waitpid(self.pid, 0)
        self.status = os.waitstatus_to_exitcode(status)
        return self.status

    def screen_tail(self) -> str:
        """The output's last characters without escape sequences and carriage returns."""
        text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", bytes(self.out)).replace(b"\r", b"")
        return text.decode("utf-8", "replace")[-40:]

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)


@pytest.fixture(scope="module")
def model(tiny_chat_dir):
    m = ignis.load(str(tiny_chat_dir), n_ctx=256, threads=1)
    yield m
    m.weights.close()


def reply(model, messages: list[dict]) -> str:
    return model.chat(messages, temperature=0, max_tokens=MAX_TOKENS).text


@pytest.fixture
def term(tmp_path, tiny_chat_dir):
    terminals = []

    def start(*flags: str, home: Path | None = None, stdout: Path | None = None) -> Terminal:
        t = Terminal(tmp_path, tiny_chat_dir, home or tmp_path / "home", *flags, stdout=stdout)
        terminals.append(t)
        return t
    yield start
    for t in terminals:
        t.close()


def saved(t: Terminal, path: Path) -> list[dict]:
    t.line(b"/save " + str(path).encode())
    t.expect(b"(saved ")
    return json.loads(path.read_text(encoding="utf-8"))


def user_turns(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


# --- through a terminal --------------------------------------------------------------------------

@terminal
def test_ctrl_c_stops_a_reply_and_keeps_the_conversation(term, tmp_path, model):
    t = term()
    t.expect(PROMPT)
    t.hold.touch()
    t.send(b"tell me\r")
    t.wait_for(t.waiting)               # the reply is under way, held at its third token
    t.send(CTRL_C)
    t.hold.unlink()
    t.line(b"again")
    messages = saved(t, tmp_path / "c.json")
    t.line(b"/exit")
    assert t.exit_status() == 0
    (u1, partial, u2, answer) = messages
    assert (u1, u2) == ({"role": "user", "content": "tell me"}, {"role": "user", "content": "again"})
    full = reply(model, [u1])
    # the reply stopped early; what was shown of it is the assistant's turn
    assert partial["role"] == "assistant" and partial["content"]
    assert full.startswith(partial["content"]) and len(partial["content"]) < len(full)
    # and the next turn was answered with the earlier turns in its prompt
    assert answer == {"role": "assistant", "content": reply(model, [u1, partial, u2])}


@terminal
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_during_the_prompts_forward_pass(term, tmp_path, model, presses):
    # A long prefill checks nothing: one Ctrl-C stops the reply once the prompt is read, showing
    # none of it; a second one stops the forward pass itself. Either way the turn is dropped and
    # the next one is answered as if it had never been (the KV slot is consistent).
    t = term()
    t.line(b"hi")
    t.expect(PROMPT)
    t.hold_prefill.touch()
    t.send(b"tell me a long story\r")
    t.wait_for(t.waiting)                 # the prompt's forward pass is under way, held
    t.send(CTRL_C)
    t.expect(b"Ctrl-C again stops now)")
    heard = t.mark
    if presses == 2:
        t.send(CTRL_C)                    # stops the held forward pass itself
    else:
        t.hold_prefill.unlink()
    dropped = b"(stopped before the reply began; the message was dropped)"
    t.expect(dropped)
    t.hold_prefill.unlink(missing_ok=True)
    # nothing of the stopped reply was shown, not even the token sampled from the prompt's logits
    assert bytes(t.out[heard:t.mark - len(dropped)]).replace(b"^C", b"").strip() == b""
    t.line(b"again")
    messages = saved(t, tmp_path / "s.json")
    hi = {"role": "user", "content": "hi"}
    again = {"role": "user", "content": "again"}
    first = {"role": "assistant", "content": reply(model, [hi])}
    assert messages == [hi, first, again,
                        {"role": "assistant", "content": reply(model, [hi, first, again])}]
    t.line(b"/exit")
    assert t.exit_status() == 0


@terminal
def test_arrow_keys_edit_the_line(term, tmp_path):
    t = term()
    t.expect(PROMPT)
    t.send(b"abc" + LEFT + LEFT + b"X\r")
    assert user_turns(saved(t, tmp_path / "a.json")) == ["aXbc"]
    t.expect(PROMPT)
    t.send(CTRL_D)
    assert t.exit_status() == 0


@terminal
@pytest.mark.skipif(not GNU_READLINE, reason="bracketed paste needs GNU readline (libedit pastes "
                                             "line by line)")
def test_a_bracketed_paste_is_one_turn(term, tmp_path):
    t = term()
    t.line(PASTE_START + b"one\rtwo\nthree\r" + PASTE_END)   # terminals paste newlines as \r
    messages = saved(t, tmp_path / "p.json")
    assert user_turns(messages) == ["one\ntwo\nthree"] and len(messages) == 2


@terminal
def test_triple_quote_block_and_backslash_are_one_turn_each(term, tmp_path):
    t = term()
    t.line(b'"""')
    for line in (b"/not a command", b"", b'second line"""'):
        t.expect(MORE)
        t.send(line + b"\r")
    t.line(b"first \\")
    t.expect(MORE)
    t.send(b"and more\r")
    assert user_turns(saved(t, tmp_path / "b.json")) == ["/not a command\n\nsecond line",
                                                         "first \nand more"]


@terminal
@pytest.mark.parametrize("key", [CTRL_D, CTRL_C])
def test_ctrl_d_and_ctrl_c_on_an_empty_line_exit_on_a_clean_line(term, key):
    t = term()
    t.line(b"hi")
    if key == CTRL_C:                    # Ctrl-C on a line with text clears it, and goes on
        t.expect(PROMPT)
        t.send(b"half typed")
        t.expect(b"half typed")
        t.press(CTRL_C, then=PROMPT)
    else:
        t.expect(PROMPT)
    t.press(key)
    assert t.exit_status() == 0
    # the shell's prompt will start on a line of its own, after the chat's last prompt
    assert t.screen_tail().endswith(">>> \n")


@terminal
def test_save_load_round_trip_and_the_system_message(term, tmp_path):
    t = term("--system", "be brief")
    t.line(b"/system")
    t.expect(b"system message: be brief")
    t.line(b"/system talk like a pirate")
    t.expect(b"(system message set)")
    t.line(b"hi")
    first = saved(t, tmp_path / "one.json")
    assert first[0] == {"role": "system", "content": "talk like a pirate"}
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    t.line(b"/reset")
    t.expect(b"(conversation cleared)")
    t.line(b"/load " + str(tmp_path / "one.json").encode())
    t.expect(b"(loaded 3 messages")
    assert saved(t, tmp_path / "two.json") == first
    t.line(b"exit")                      # leaves; not a message for the model
    assert t.exit_status() == 0


@terminal
def test_history_is_kept_across_sessions(term, tmp_path):
    home = tmp_path / "home"
    t = term(home=home)
    t.line(b"remember me")
    t.line(b"/exit")
    assert t.exit_status() == 0
    history = home / "chat_history"
    assert stat.S_IMODE(history.stat().st_mode) == 0o600      # private, like a shell's history
    t = term(home=home)
    t.expect(PROMPT)
    t.send(UP + b"\r")                    # /exit and its kin are not kept
    assert user_turns(saved(t, tmp_path / "h.json")) == ["remember me"]


@terminal
@pytest.mark.parametrize("leave", [b"/exit\r", CTRL_D])
def test_stdout_redirected_gets_the_replies_and_the_terminal_the_prompts(term, tmp_path, model,
                                                                         leave):
    # `ignis chat M > log.txt`: stdin is the terminal, stdout a file
    log, home = tmp_path / "log.txt", tmp_path / "home"
    t = term(stdout=log, home=home)
    t.expect(PROMPT)                     # on the terminal (stderr), not in the file
    t.send(b"hi\r")
    t.expect(PROMPT)
    t.send(b'"""\r')
    t.expect(MORE)
    t.send(b"two\r")
    t.expect(MORE)
    t.send(b'lines"""\r')
    t.expect(PROMPT)
    t.send(leave)
    assert t.exit_status() == 0
    hi = {"role": "user", "content": "hi"}
    first = reply(model, [hi])
    second = reply(model, [hi, {"role": "assistant", "content": first},
                           {"role": "user", "content": "two\nlines"}])
    assert log.read_text(encoding="utf-8") == f"{first}\n\n{second}\n\n"
    # no readline there (input() would not use it): no history file either
    assert not (home / "chat_history").exists()
    # the shell's prompt will start on a line of its own
    assert t.screen_tail().endswith(">>> /exit\n" if leave == b"/exit\r" else ">>> \n")


# --- without a terminal ----------------------------------------------------------------------------

def lines(*items):
    """A read_line that returns `items` (an exception instance is raised), then EOFError."""
    queue = list(items)
    prompts = []

    def read_line(prompt):
        prompts.append(prompt)
        if not queue:
            raise EOFError
        item = queue.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item
    read_line.prompts = prompts
    return read_line


def read_all(read_line) -> list[Input]:
    reader, got = TurnReader(read_line), []
    while True:
        try:
            got.append(reader.read())
        except EOFError:
            return got


def test_reader_joins_blocks_continuations_and_pastes():
    read_line = lines("plain", '"""', "a", "", 'b"""', '"""inline"""', '"""start', 'end"""',
                      "x\\", "y\\", "z", "paste one\rpaste two\r", '"""\npasted\nblock\n"""\nafter',
                      "/help")
    assert read_all(read_line) == [
        Input("plain", False), Input("a\n\nb", True), Input("inline", True),
        Input("start\nend", True), Input("x\ny\nz", False), Input("paste one\npaste two", False),
        Input("pasted\nblock\nafter", True), Input("/help", False)]
    assert read_line.prompts[:5] == [">>> ", ">>> ", "... ", "... ", "... "]


def test_reader_at_the_end_of_input_and_on_ctrl_c():
    from ignis.api.repl import LineInterrupted
    # an open block is sent as it stands when the input ends
    assert read_all(lines('"""', "unfinished")) == [Input("unfinished", True)]
    # Ctrl-C drops a pending block or a line with text, and quits on an empty line
    reader = TurnReader(lines('"""', "dropped", LineInterrupted(False), LineInterrupted(True),
                              "kept", LineInterrupted(False)))
    assert reader.read() == Input("", False)
    assert reader.read() == Input("", False)
    assert reader.read() == Input("kept", False)
    with pytest.raises(KeyboardInterrupt):
        reader.read()


COMMON = ["--ctx", "256", "--threads", "1", "-q", "--temperature", "0", "--max-tokens", str(MAX_TOKENS)]


@pytest.mark.parametrize("word", ["exit", "quit", "/exit", "/quit", "/bye"])
def test_exit_words_are_not_sent_to_the_model(tiny_chat_dir, model, capsys, monkeypatch, word):
    monkeypatch.setattr("sys.stdin", io.StringIO(f"hi\n  {word} \nmore\n"))
    assert main(["chat", str(tiny_chat_dir), *COMMON]) == 0
    hi = reply(model, [{"role": "user", "content": "hi"}])
    assert capsys.readouterr().out == f"{hi}\n\n"


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_load_refuses_bad_files_with_one_line_each(tiny_chat_dir, tmp_path, capsys, monkeypatch):
    good = tmp_path / "good.json"
    bad = {
        str(tmp_path / "missing.json"): "no such file",
        str(tmp_path): "is a directory",
        write(tmp_path / "bad.json", '[{"role": "user", "content": "hi"'): "is not JSON",
        write(tmp_path / "dict.json", '{"role": "user", "content": "hi"}'): "holds a JSON dict",
        write(tmp_path / "str.json", '["hi"]'): "message 1 is a str",
        write(tmp_path / "role.json", '[{"role": "bot", "content": "hi"}]'): "role 'bot'",
        write(tmp_path / "content.json", '[{"role": "user", "content": ["hi"]}]'): "content",
        write(tmp_path / "late.json", '[{"role": "user", "content": "hi"}, '
                                      '{"role": "system", "content": "x"}]'): "only the first",
    }
    loads = "".join(f"/load {path}\n" for path in bad)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/system keep me\nhi\n{loads}/save {good}\n"))
    assert main(["chat", str(tiny_chat_dir), *COMMON]) == 0
    errors = [e for e in capsys.readouterr().err.splitlines() if e.startswith("ignis chat: error:")]
    assert len(errors) == len(bad)
    for error, words in zip(errors, bad.values()):
        assert words in error
    # the conversation is untouched
    assert [m["role"] for m in json.loads(good.read_text())] == ["system", "user", "assistant"]


def test_load_conversation_accepts_what_save_writes(tmp_path):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "你好 👋"},
                {"role": "assistant", "content": "```py\nprint(1)\n```", "name": "ignored"}]
    path = Path(write(tmp_path / "c.json", json.dumps(messages)))
    assert load_conversation(path) == [{k: m[k] for k in ("role", "content")} for m in messages]
    assert load_conversation(Path(write(tmp_path / "empty.json", "[]"))) == []
    with pytest.raises(ConversationFileError, match="not UTF-8"):
        (tmp_path / "latin1.json").write_bytes(b'[{"role": "user", "content": "\xe9"}]')
        load_conversation(tmp_path / "latin1.json")


class _Run:
    def __init__(self, pieces, ctrl_c_at=None):
        self.pieces, self.result, self.ctrl_c_at = pieces, None, ctrl_c_at

    def __iter__(self):
        from ignis.generate import Chunk
        for i, p in enumerate(self.pieces):
            if i == self.ctrl_c_at:            # Ctrl-C while this piece is computed
                signal.raise_signal(signal.SIGINT)
            yield Chunk(p, ())
        self.result = type("R", (), {"text": "".join(self.pieces)})()

    def close(self):
        pass


class _FakeModel:
    n_ctx = 100

    def __init__(self, pieces, ctrl_c_at=None):
        self.pieces, self.ctrl_c_at = pieces, ctrl_c_at

    def chat_prompt_ids(self, messages):
        return [1, 2, 3]

    def start(self, ids, **kwargs):
        return _Run(self.pieces, self.ctrl_c_at)


def test_replies_stream_as_they_come_wide_characters_and_code_untouched():
    pieces = ["你好", "，世界", " 👋🏽", "\n```python\n", "def f():\n", "    return '表'\n", "```"]
    out, err = io.StringIO(), io.StringIO()
    chat = Chat(_FakeModel(pieces), {}, out=out, err=err)
    chat.handle(Input("hi", False))
    assert out.getvalue() == "".join(pieces) + "\n\n"          # no wrapping, no escapes
    assert chat.messages[-1] == {"role": "assistant", "content": "".join(pieces)}
    chat.handle(Input("/nope", False))
    assert "unknown command '/nope'; /help lists the commands" in err.getvalue()
    chat.handle(Input("/help", False))
    assert "/system TEXT" in err.getvalue() and "Ctrl-C" in err.getvalue()


def test_ctrl_c_while_a_piece_is_computed_shows_no_more():
    # what the user saw when pressing Ctrl-C is the answer: the piece in hand is not shown after it
    out, err = io.StringIO(), io.StringIO()
    chat = Chat(_FakeModel(["one", " two", " three"], ctrl_c_at=1), {}, out=out, err=err)
    chat.handle(Input("hi", False))
    assert out.getvalue() == "one\n\n"
    assert chat.messages == [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "one"}]
    chat = Chat(_FakeModel(["one", " two"], ctrl_c_at=0), {}, out=out, err=err)
    chat.handle(Input("hi", False))
    assert chat.messages == [] and "the message was dropped" in err.getvalue()


def test_a_second_ctrl_c_stops_the_prompts_forward_pass_and_the_kv_slot_stays_consistent(
        tiny_chat_dir, monkeypatch):
    from ignis.runtime.engine import Engine
    m = ignis.load(str(tiny_chat_dir), n_ctx=256, threads=1)
    try:
        out, err = io.StringIO(), io.StringIO()
        chat = Chat(m, {"temperature": 0, "max_tokens": MAX_TOKENS}, out=out, err=err)
        chat.handle(Input("hi", False))
        session, forward, pressed = m._sessions[0], Engine.forward, []

        def slow_forward(self, tokens, **kwargs):
            if len(tokens) > 1 and not pressed:        # the prompt's pass: Ctrl-C, Ctrl-C
                pressed.append(forward(self, tokens[:2], **kwargs))   # the slot moves, then
                signal.raise_signal(signal.SIGINT)
                assert "Ctrl-C again stops now" in err.getvalue()
                signal.raise_signal(signal.SIGINT)
                raise AssertionError("the second Ctrl-C did not stop the forward pass")
            return forward(self, tokens, **kwargs)
        monkeypatch.setattr(Engine, "forward", slow_forward)
        chat.handle(Input("tell me a long story", False))
        assert pressed and "the message was dropped" in err.getvalue()
        assert len(chat.messages) == 2
        # KVSession.prefill reset the slot: the engine and the ids it holds agree
        assert session.cached == [] and session.engine.n_past == 0
        chat.handle(Input("again", False))
        assert chat.messages[-1]["content"] == reply(m, chat.messages[:-1])
    finally:
        m.weights.close()


def _chat_with_a_turn() -> tuple[Chat, io.StringIO]:
    err = io.StringIO()
    chat = Chat(_FakeModel(["hello"]), {}, system="s", out=io.StringIO(), err=err)
    chat.handle(Input("hi", False))
    return chat, err


def test_save_replaces_a_conversation_never_another_file_unless_told(tmp_path):
    chat, err = _chat_with_a_turn()
    conv, notes = tmp_path / "c.json", tmp_path / "notes.txt"
    chat.command(f"/save {conv}")
    os.chmod(conv, 0o640)
    chat.handle(Input("more", False))
    chat.command(f"/save {conv}")                 # an earlier /save: replaced, its mode kept
    assert load_conversation(conv) == chat.messages and len(chat.messages) == 5
    assert stat.S_IMODE(conv.stat().st_mode) == 0o640
    for text in ("my notes", "", '{"role": "user", "content": "x"}'):
        notes.write_text(text)
        chat.command(f"/save {notes}")
        assert notes.read_text() == text
        assert err.getvalue().splitlines()[-1].startswith(f"ignis chat: error: not saved: {notes}")
        assert err.getvalue().endswith(f"; /save! {notes} replaces it anyway\n")
    chat.command(f"/save! {notes}")
    assert load_conversation(notes) == chat.messages
    chat.command(f"/save {tmp_path}")
    assert "is a directory" in err.getvalue().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "notes.txt"]   # no temp file
    assert "/save! FILE" in HELP


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_save_leaves_the_old_file_whole(tmp_path, monkeypatch, failure):
    chat, err = _chat_with_a_turn()
    conv = tmp_path / "c.json"
    chat.command(f"/save {conv}")
    before = conv.read_bytes()
    chat.handle(Input("more", False))

    def fail(fd):
        raise failure
    monkeypatch.setattr(os, "fsync", fail)         # the disk fills, or Ctrl-C, mid-write
    if isinstance(failure, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):     # run_chat takes it back to the prompt
            chat.command(f"/save {conv}")
    else:
        chat.command(f"/save {conv}")
        assert err.getvalue().endswith(f"cannot write {conv}: no space left on device\n")
    assert conv.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_load_replaces_system_message_and_turns_together(tmp_path):
    # A Ctrl-C may land between any two statements of /load: the conversation is then the old
    # one or the loaded one, never the loaded system message with the old turns.
    new = [{"role": "system", "content": "new"}, {"role": "user", "content": "u"},
           {"role": "assistant", "content": "a"}]
    path = write(tmp_path / "c.json", json.dumps(new))
    old = [{"role": "system", "content": "old"}, {"role": "user", "content": "x"},
           {"role": "assistant", "content": "y"}]
    landed = 0
    while True:
        landed += 1
        chat = Chat(_FakeModel([]), {}, system="old", out=io.StringIO(), err=io.StringIO())
        chat.turns = old[1:]
        lines = [0]

        def ctrl_c_at_a_line(frame, event, arg):
            if event == "line":
                lines[0] += 1
                if lines[0] == landed:
                    raise KeyboardInterrupt
            return ctrl_c_at_a_line

        def trace(frame, event, arg):
            return ctrl_c_at_a_line if frame.f_code is Chat._load.__code__ else None
        sys.settrace(trace)
        try:
            chat.command(f"/load {path}")
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        assert chat.messages in (old, new), landed
        if not interrupted:
            assert chat.messages == new
            break


def test_a_ctrl_c_while_the_history_is_written_goes_back_to_the_prompt(tiny_chat_dir, model, capsys,
                                                                       monkeypatch):
    from ignis.api.repl import LineEditor
    calls = []

    def slow_disk(self, entry):
        calls.append(entry)
        if len(calls) == 1:
            raise KeyboardInterrupt
    monkeypatch.setattr(LineEditor, "remember", slow_disk)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nmore\n"))
    assert main(["chat", str(tiny_chat_dir), *COMMON]) == 0      # not 130: the chat went on
    assert calls == ["hi", "more"]
    more = reply(model, [{"role": "user", "content": "more"}])     # "hi" was not sent
    assert capsys.readouterr().out == f"{more}\n\n"


def test_the_sigint_handler_is_restored_when_the_chat_ends(tiny_chat_dir, monkeypatch):
    def mine(signum, frame):
        pass
    old = signal.signal(signal.SIGINT, mine)
    try:
        monkeypatch.setattr("sys.stdin", io.StringIO("hi\n/save\n"))
        assert main(["chat", str(tiny_chat_dir), *COMMON]) == 0
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, old)


class _FakeReadline:
    """The readline calls LineEditor makes, recording the history it is given."""
    __doc__ = "fake"
    _READLINE_RUNTIME_VERSION = 0x0600          # before bracketed paste

    def __init__(self, on_add=None):
        self.entries, self.on_add = [], on_add

    def set_auto_history(self, on):
        pass

    def add_history(self, entry):
        self.entries.append(entry)
        if self.on_add is not None:
            self.on_add()
            self.on_add = None

    def get_line_buffer(self):
        return ""


def _editor(monkeypatch, history: Path, fake: _FakeReadline):
    from ignis.api.repl import LineEditor
    monkeypatch.setattr("ignis.api.repl._import_readline", lambda: fake)
    return LineEditor(True, history)


def test_a_damaged_history_file_is_tolerated(tmp_path, monkeypatch):
    history = tmp_path / "chat_history"
    history.write_bytes(b'"one"\n' b"not json\n" b'"caf\xe9 latin-1"\n' b"42\n" b'["a list"]\n'
                        b"\n" b'"  "\n' b"\x00\x00\x00\n" b'"two\\nlines"\n' b'"cut short')
    fake = _FakeReadline()
    editor = _editor(monkeypatch, history, fake)
    assert fake.entries == ["one", "caf\ufffd latin-1", "two\nlines"]
    editor.remember("three")                      # and the file goes on growing
    assert history.read_bytes().endswith(b'"cut short\n"three"\n')
    assert fake.entries[-1] == "three"
    fake = _FakeReadline()
    _editor(monkeypatch, history, fake)
    assert fake.entries == ["one", "caf\ufffd latin-1", "two\nlines", "three"]
    # a history that cannot be read or written is no history, not an error
    (tmp_path / "dir").mkdir()
    fake = _FakeReadline()
    editor = _editor(monkeypatch, tmp_path / "dir", fake)
    editor.remember("four")
    assert fake.entries == ["four"] and editor.history is None


def test_the_history_is_trimmed_by_replacing_the_file(tmp_path, monkeypatch):
    from ignis.api.repl import HISTORY_LENGTH
    history = tmp_path / "chat_history"
    old = "".join(json.dumps(f"m{i}") + "\n" for i in range(2 * HISTORY_LENGTH + 5))
    history.write_text(old)
    os.chmod(history, 0o600)

    def another_session_appends():            # between this session's reading and trimming
        with open(history, "a") as f:
            f.write(json.dumps("from another session") + "\n")
    with open(history) as reader:                  # another session reading it meanwhile
        _editor(monkeypatch, history, _FakeReadline(another_session_appends))
        # sees the old file whole (with the other session's line): it was replaced, not rewritten
        assert reader.read() == old + '"from another session"\n'
    kept = [json.loads(line) for line in history.read_text().splitlines()]
    assert kept == [f"m{i}" for i in range(HISTORY_LENGTH + 6, 2 * HISTORY_LENGTH + 5)] + [
        "from another session"]
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["chat_history"]


def test_verbose_prints_timings_after_each_turn(tiny_chat_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nmore\n"))
    assert main(["chat", str(tiny_chat_dir), *COMMON, "--verbose"]) == 0
    err = capsys.readouterr().err
    assert err.count("prompt eval:") == 2 and err.count("tokens/s") >= 4


def test_chat_help_shows_the_keys_and_commands(capsys):
    with pytest.raises(SystemExit):
        main(["chat", "--help"])
    out = capsys.readouterr().out
    for words in ("/system TEXT", "/save FILE", "/load FILE", '"""', "Ctrl-C stops a reply",
                  "chat_history"):
        assert words in out
