"""`ignis run` and `ignis chat` on the tiny model, in-process: streamed text equals the Python API's,
sampling flags reach the sampler, bad values are one-line errors, --verbose reports tokens/s."""
from __future__ import annotations

import io

import pytest

import ignis
from ignis.api.cli import main


@pytest.fixture(scope="module")
def tiny_dir(tiny_chat_dir):
    return tiny_chat_dir


@pytest.fixture(scope="module")
def model(tiny_dir):
    m = ignis.load(str(tiny_dir), n_ctx=128, threads=1)
    yield m
    m.weights.close()


COMMON = ["--ctx", "128", "--threads", "1", "-q"]


def test_run_streams_what_generate_returns(tiny_dir, model, capsys):
    assert main(["run", str(tiny_dir), "Hello", "--raw", "--temperature", "0", "--max-tokens", "12",
                 *COMMON]) == 0
    out, err = capsys.readouterr()
    assert out == model.generate("Hello", temperature=0, max_tokens=12).text + "\n"
    assert err == ""                                          # quiet unless asked


def test_run_applies_the_chat_template_by_default(tiny_dir, model, capsys):
    # An instruct model's prompt is a user turn unless --raw says otherwise (llama.cpp does the same).
    assert main(["run", str(tiny_dir), "Say hi.", "--temperature", "0", "--max-tokens", "8", *COMMON]) == 0
    want = model.chat([{"role": "user", "content": "Say hi."}], temperature=0, max_tokens=8).text
    assert capsys.readouterr().out == want + "\n"
    assert main(["run", str(tiny_dir), "Say hi.", "--raw", "--system", "be brief", *COMMON]) == 1
    assert "--system needs the chat template" in capsys.readouterr().err


def test_run_chat_sampling_flags_and_verbose(tiny_dir, model, capsys):
    args = ["--temperature", "0.9", "--top-k", "30", "--top-p", "0.9", "--min-p", "0.01",
            "--seed", "3", "--max-tokens", "10", "--repetition-penalty", "1.2"]
    assert main(["run", str(tiny_dir), "Say hi.", "--chat", "--verbose", *args, *COMMON]) == 0
    out, err = capsys.readouterr()
    want = model.chat([{"role": "user", "content": "Say hi."}], temperature=0.9, top_k=30, top_p=0.9,
                      min_p=0.01, seed=3, max_tokens=10, repetition_penalty=1.2)
    assert out == want.text + "\n"
    assert "prompt eval:" in err and "tokens/s" in err and "load time:" in err


def test_run_stop_flag_cuts_the_text(tiny_dir, model, capsys):
    full = model.generate("abc", temperature=0, max_tokens=12).text
    stop = full[3:5]
    assert stop and main(["run", str(tiny_dir), "abc", "--raw", "--temperature", "0", "--max-tokens", "12",
                          "--stop", stop, *COMMON]) == 0
    assert capsys.readouterr().out == full[:full.index(stop)] + "\n"


def test_run_reads_the_prompt_from_stdin(tiny_dir, model, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello"))
    assert main(["run", str(tiny_dir), "--raw", "--temperature", "0", "--max-tokens", "5", *COMMON]) == 0
    assert capsys.readouterr().out == model.generate("Hello", temperature=0, max_tokens=5).text + "\n"


@pytest.mark.parametrize("flags,words", [(["--temperature", "5"], "--temperature"),
                                         (["--top-p", "0"], "--top-p"), (["--stop", ""], "--stop")])
def test_bad_flags_are_one_line_errors(tiny_dir, capsys, flags, words):
    assert main(["run", str(tiny_dir), "hi", *flags, *COMMON]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ignis run: error:") and words in err
    assert len(err.strip().splitlines()) == 1


def test_chat_keeps_history_and_understands_commands(tiny_dir, model, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nmore\n/stats\n/nope\n/reset\nhello\n/bye\n"))
    assert main(["chat", str(tiny_dir), "--temperature", "0", "--max-tokens", "4", *COMMON]) == 0
    out, err = capsys.readouterr()
    assert "eval:" in err and "tokens/s" in err             # /stats
    assert "unknown command '/nope'" in err and "conversation cleared" in err
    kw = dict(temperature=0, max_tokens=4)
    hi = model.chat([{"role": "user", "content": "hi"}], **kw).text
    more = model.chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": hi},
                       {"role": "user", "content": "more"}], **kw).text
    hello = model.chat([{"role": "user", "content": "hello"}], **kw).text   # history was reset
    assert out == f"{hi}\n\n{more}\n\n{hello}\n\n"


@pytest.mark.parametrize("cmd", ["run", "chat"])
def test_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--temperature", "--top-k", "--top-p", "--min-p", "--seed", "--max-tokens", "--stop",
                 "--verbose", "--weights"):
        assert flag in out


def test_chat_survives_a_turn_past_the_context(tiny_dir, model, capsys, monkeypatch):
    """A turn that cannot fit is refused with the numbers and dropped; the conversation goes on."""
    long = "word " * 200                       # far more than the 128-position context
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{long}\nhi\n/bye\n"))
    assert main(["chat", str(tiny_dir), "--temperature", "0", "--max-tokens", "4", *COMMON]) == 0
    out, err = capsys.readouterr()
    assert "context" in err and "/reset" in err
    assert "--ctx" in err and "n_ctx" not in err           # the flag, not the Python argument
    hi = model.chat([{"role": "user", "content": "hi"}], temperature=0, max_tokens=4).text
    assert out == f"{hi}\n\n"                  # the refused turn left no trace in the history


def test_max_tokens_is_a_cap_at_the_end_of_the_context(tiny_dir, model, capsys, monkeypatch):
    """On the command line --max-tokens is "at most", as in llama.cpp: a long turn still gets the
    room that is left instead of a refusal."""
    prompt = "w " * 10
    n = len(model.chat_prompt_ids([{"role": "user", "content": prompt}]))
    assert n < 128 < n + 100
    assert main(["run", str(tiny_dir), prompt, "--temperature", "0", "--max-tokens", "100",
                 *COMMON]) == 0
    out, err = capsys.readouterr()
    r = model.chat([{"role": "user", "content": prompt}], temperature=0, max_tokens=128 - n)
    assert out == r.text + "\n" and r.completion_tokens == 128 - n
